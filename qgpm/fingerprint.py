"""Model fingerprints: what identifies a model for its head set and its config preset.

A file name or an HF id is not an identity: ``Llama-3.1-8B.Q4.gguf`` and
``Llama-3.2-1B.Q4.gguf`` used to both become "Llama-3", and the folders ``run1/final``
and ``run2/final`` both "final". A :class:`ModelFingerprint` is instead computed from
the loaded model:

* ``arch`` -- the architecture config: family, vocabulary size, width, depth, heads,
  KV heads, head size, MLP size and the RoPE parameters (everything a head index and a
  position plan depend on); for Gemma 3 also its layer kinds, window and attention scale;
* ``tokenizer`` -- a hash of the vocabulary (token -> id, added tokens included);
* ``weights`` -- a hash of the first rows of the input embedding, rounded to bfloat16
  (the same for fp32 and bf16 loads of one checkpoint; different for another fine-tune or a
  quantized copy), and ``weights_fp16``, the same rows rounded to float16, for fp16 loads:
  rounding to float16 and then to bfloat16 lands on another bfloat16 value for about one
  value in twenty, so no one rounding serves all three. ``None`` when the weights are not
  materialized.

``key`` hashes ``arch`` and ``tokenizer``: it decides whether a head set or a preset
*fits* the model (a head set with another key is rejected). ``weights`` only picks the
best of several stored sets with the same key (another fine-tune of one base model, a
quantized copy) and makes :mod:`qgpm.heads` warn when the set was calibrated on other
weights. ``name`` is the readable name kept beside the key.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import weakref
from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = [
    "ModelFingerprint",
    "model_fingerprint",
    "fingerprint_key",
    "arch_config",
    "tokenizer_hash",
    "weights_hash",
    "slug",
    "SHAPE_FIELDS",
    "gguf_shape",
    "FULL_CONFIG_ATTR",
]

_ARCH_FIELDS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
)

# Extra architecture fields of families whose layers differ from one another (Gemma 3: which
# layers are sliding-window ones, the window, the attention scale). Only these families get
# them, so the keys of the other families (and their shipped head sets) stay as they were.
_FAMILY_ARCH_FIELDS = {
    "gemma3_text": ("layer_types", "sliding_window", "query_pre_attn_scalar"),
}


@dataclass(frozen=True)
class ModelFingerprint:
    """Identity of a loaded model (see the module docstring)."""

    key: str
    name: str
    arch: dict
    tokenizer: str
    weights: str | None = None
    weights_fp16: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelFingerprint":
        unknown = set(d) - {"key", "name", "arch", "tokenizer", "weights", "weights_fp16"}
        if unknown:
            raise ValueError(f"unknown fingerprint fields {sorted(unknown)}")
        return cls(key=str(d["key"]), name=str(d.get("name", "")), arch=dict(d.get("arch") or {}),
                   tokenizer=str(d.get("tokenizer", "")), weights=d.get("weights"), weights_fp16=d.get("weights_fp16"))

    def same_weights(self, stored: dict[str, Any]) -> bool:
        """Whether a stored fingerprint (a head set's ``fingerprint`` dict) was taken on these
        weights: the bfloat16 digests agree (fp32 / bf16 loads), or the float16 ones (fp16 loads)."""
        return bool((self.weights and stored.get("weights") == self.weights)
                    or (self.weights_fp16 and stored.get("weights_fp16") == self.weights_fp16))

    def describe(self) -> str:
        """``name [key]`` and the architecture in one line, for error messages."""
        a = self.arch
        shape = f"{a.get('model_type', '?')}, {a.get('num_hidden_layers', '?')} layers x {a.get('num_attention_heads', '?')} heads, hidden {a.get('hidden_size', '?')}, vocab {a.get('vocab_size', '?')}"
        return f"{self.name or '?'} [key {self.key}; {shape}]"


def _plain(v: Any) -> Any:
    """JSON-stable form of a config value (floats by repr, dicts sorted)."""
    if isinstance(v, float):
        return float(repr(v)) if v == v else "nan"
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in sorted(v.items()) if x is not None}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def arch_config(config: Any) -> dict:
    """The architecture part of a transformers config (see the module docstring)."""
    out: dict[str, Any] = {f: getattr(config, f, None) for f in _ARCH_FIELDS}
    if out["num_key_value_heads"] is None:
        out["num_key_value_heads"] = out["num_attention_heads"]
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None and out["hidden_size"] and out["num_attention_heads"]:
        head_dim = out["hidden_size"] // out["num_attention_heads"]
    out["head_dim"] = head_dim
    rope = getattr(config, "rope_parameters", None)  # transformers >= 5
    if not rope:
        rope = dict(getattr(config, "rope_scaling", None) or {})
        theta = getattr(config, "rope_theta", None)
        if theta is not None:
            rope["rope_theta"] = theta
    rope = dict(rope or {})
    for k in ("rope_type", "type"):
        if rope.get(k) in (None, "default"):
            rope.pop(k, None)
    out["rope"] = rope
    for f in _FAMILY_ARCH_FIELDS.get(out["model_type"], ()):
        out[f] = getattr(config, f, None)
    return _plain({k: v for k, v in out.items() if v is not None})


_TOKENIZER_HASHES: "weakref.WeakKeyDictionary[Any, tuple[int, str]]" = weakref.WeakKeyDictionary()


def tokenizer_hash(tokenizer: Any) -> str:
    """SHA-256 (first 16 hex digits) of the tokenizer's vocabulary, added tokens included."""
    size = len(tokenizer)
    try:
        hit = _TOKENIZER_HASHES.get(tokenizer)
    except TypeError:  # not weak-referenceable / hashable
        hit = None
    if hit is not None and hit[0] == size:
        return hit[1]
    vocab = tokenizer.get_vocab()
    items = sorted((str(t), int(i)) for t, i in vocab.items())
    digest = hashlib.sha256(json.dumps(items, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()[:16]
    try:
        _TOKENIZER_HASHES[tokenizer] = (size, digest)
    except TypeError:
        pass
    return digest


def weights_hash(model: Any, rows: int = 8, rounding: torch.dtype = torch.bfloat16) -> str | None:
    """Hash of the first ``rows`` rows of the input embedding, rounded to ``rounding``."""
    try:
        emb = model.get_input_embeddings().weight
    except (AttributeError, NotImplementedError):
        return None
    if emb is None or emb.is_meta or emb.device.type == "meta":
        return None
    with torch.no_grad():
        sample = emb[:rows].detach().to(rounding).to(torch.float32).cpu().contiguous()
    return hashlib.sha256(sample.numpy().tobytes()).hexdigest()[:16]


def slug(name: str) -> str:
    """A file-name-safe lower-case form of a readable model name."""
    s = re.sub(r"[^a-z0-9._-]+", "-", name.strip().lower().replace("/", "--")).strip("-.")
    return s or "model"


FULL_CONFIG_ATTR = "qgpm_full_config"
"""Attribute of a model loaded with fewer decoder layers than its checkpoint (:mod:`qgpm.partial`)
holding the checkpoint's own config: its fingerprint is the whole model's."""


def model_fingerprint(model: Any, tokenizer: Any, name: str = "") -> ModelFingerprint:
    """The :class:`ModelFingerprint` of a loaded model and its tokenizer (of the whole checkpoint
    for a model loaded with its first layers only)."""
    arch = arch_config(getattr(model, FULL_CONFIG_ATTR, None) or model.config)
    tok = tokenizer_hash(tokenizer)
    return ModelFingerprint(key=fingerprint_key(arch, tok), name=name, arch=arch, tokenizer=tok, weights=weights_hash(model),
                            weights_fp16=weights_hash(model, rounding=torch.float16))


def fingerprint_key(arch: dict, tokenizer: str) -> str:
    """The key of an architecture config and a tokenizer hash (16 hex digits)."""
    return hashlib.sha256(json.dumps({"arch": arch, "tokenizer": tokenizer}, sort_keys=True).encode()).hexdigest()[:16]


SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
"""The part of :func:`arch_config` a GGUF header gives directly (see :func:`gguf_shape`)."""

_GGUF_SHAPE_KEYS = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "vocab_size": "vocab_size",
}
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def gguf_shape(path: str) -> dict | None:
    """:data:`SHAPE_FIELDS` of a GGUF file, read from its header in well under a second.

    Reading a GGUF's config through transformers parses every metadata field (the
    tokenizer arrays too) and takes as long as loading the weights; this reads the few
    scalars and the token count only, so a missing head set is reported before the
    load. ``None`` when the header cannot be read (then nothing is concluded).
    """
    def read(f, fmt):
        size = struct.calcsize(fmt)
        data = f.read(size)
        if len(data) != size:
            raise EOFError
        return struct.unpack(fmt, data)[0]

    def read_str(f):
        return f.read(read(f, "<Q")).decode("utf-8", "replace")

    def skip_value(f, vtype):
        if vtype in _GGUF_SCALARS:
            f.seek(struct.calcsize(_GGUF_SCALARS[vtype]), 1)
        elif vtype == 8:
            f.seek(read(f, "<Q"), 1)
        elif vtype == 9:
            itype, count = read(f, "<I"), read(f, "<Q")
            if itype in _GGUF_SCALARS:
                f.seek(count * struct.calcsize(_GGUF_SCALARS[itype]), 1)
            else:
                for _ in range(count):
                    skip_value(f, itype)
        else:
            raise ValueError(f"unknown GGUF value type {vtype}")

    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF" or read(f, "<I") < 2:
                return None
            read(f, "<Q")  # tensor count
            n_kv = read(f, "<Q")
            arch, values, n_tokens = None, {}, None
            for _ in range(n_kv):
                key, vtype = read_str(f), read(f, "<I")
                if vtype in _GGUF_SCALARS:
                    values[key] = read(f, _GGUF_SCALARS[vtype])
                elif vtype == 8 and key == "general.architecture":
                    arch = read_str(f)
                elif vtype == 9 and key == "tokenizer.ggml.tokens":
                    pos = f.tell()
                    read(f, "<I")
                    n_tokens = read(f, "<Q")
                    f.seek(pos)
                    skip_value(f, vtype)
                else:
                    skip_value(f, vtype)
    except (OSError, EOFError, ValueError, struct.error):
        return None
    if arch is None:
        return None
    out = {}
    for key, name in _GGUF_SHAPE_KEYS.items():
        v = values.get(f"{arch}.{key}")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[name] = int(v)
    if "vocab_size" not in out and n_tokens is not None:
        out["vocab_size"] = int(n_tokens)
    if "num_key_value_heads" not in out and "num_attention_heads" in out:
        out["num_key_value_heads"] = out["num_attention_heads"]
    return out if set(out) == set(SHAPE_FIELDS) else None
