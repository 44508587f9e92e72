"""Head sets: which (layer, head) pairs pass 1 reads, and how they are chosen (App. A).

A head set is stored as JSON (shipped sets in ``qgpm/data/heads/``, sets written by
``qgpm calibrate`` in :func:`user_head_dir`)::

    {"model": "SmolLM2-135M-Instruct", "heads": [[layer, head], ...],
     "mrr": [...], "random_mrr": ..., "method": "...", "samples": ..., "meta": {...},
     "fingerprint": {"key": "...", "name": "...", "arch": {...}, "tokenizer": "...", "weights": "...",
                     "weights_fp16": "..."}}

Stored sets are found by the model's fingerprint (:mod:`qgpm.fingerprint`), not by file
name: the file name (``<readable-name>--<key>[-<weights>].json``) is only for people.
A set whose fingerprint key differs from the model's is rejected
(:class:`HeadSetMismatchError`); one calibrated on other weights with the same key
(another fine-tune, a quantized copy) is used with a warning on logger ``qgpm`` when no
exact match is stored.

Calibration scores every (layer, head) by the mean reciprocal rank of the evidence
sentence under that head's own sentence signal (Eq. 4 max over tokens of the sentence),
ties counted at the expected rank, and keeps the best ``top`` heads.
"""

from __future__ import annotations

import json
import logging
import numbers
import os
import threading
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

from .config import PRESET_NAMES
from .fingerprint import ModelFingerprint, slug

__all__ = [
    "HeadSet",
    "HeadSetMissingError",
    "HeadSetMismatchError",
    "choose_head_set",
    "find_head_set",
    "check_head_set",
    "head_set_file_name",
    "known_model_name",
    "has_head_set_for_shape",
    "load_head_set",
    "missing_head_set_error",
    "stored_head_set_path",
    "parse_heads",
    "reciprocal_rank",
    "user_head_dir",
    "shipped_head_dir",
]

logger = logging.getLogger("qgpm")


class HeadSetMissingError(LookupError):
    """No head set is stored for this model."""


class HeadSetMismatchError(ValueError):
    """The head set was made for another model (its fingerprint key differs)."""


def _whole(value: Any) -> bool:
    """An int-like layer or head index: an int (numpy's too) or a whole float, not a bool."""
    if isinstance(value, bool):
        return False
    return isinstance(value, numbers.Integral) or (isinstance(value, numbers.Real) and float(value).is_integer())


@dataclass
class HeadSet:
    """Selected heads of one model, best first, with their calibration quality.

    ``fingerprint`` is the :class:`~qgpm.fingerprint.ModelFingerprint` (as a dict) of the
    model the set was calibrated on; empty for hand-made sets and for sets stored before
    fingerprints existed.
    """

    model: str
    heads: list[tuple[int, int]]
    mrr: list[float] = field(default_factory=list)
    random_mrr: float | None = None
    method: str = ""
    samples: int = 0
    meta: dict = field(default_factory=dict)
    fingerprint: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = [x for x in self.heads if isinstance(x, (str, bytes)) or not (hasattr(x, "__len__") and len(x) == 2 and all(map(_whole, x)))]
        if bad:
            raise TypeError(f"heads must be (layer, head) pairs of ints, e.g. [(14, 3), (15, 6)]; got {bad[0]!r}")
        self.heads = [(int(l), int(h)) for l, h in self.heads]
        if not self.heads:
            raise ValueError("a head set needs at least one (layer, head)")
        if len(set(self.heads)) != len(self.heads):
            raise ValueError("a head set lists a head twice")

    @property
    def min_top_z(self) -> float | None:
        """The flat-relevance threshold in this model's z units, stored when the set was calibrated
        (``meta["confidence"]``, :func:`qgpm.calibrate.flat_relevance_threshold`); ``None`` if none."""
        value = (self.meta.get("confidence") or {}).get("min_top_z")
        return None if value is None else float(value)

    @property
    def deepest_layer(self) -> int:
        return max(l for l, _ in self.heads)

    @property
    def key(self) -> str | None:
        """The fingerprint key of the model the set was made for (``None`` if unknown)."""
        return self.fingerprint.get("key") or None

    def top(self, k: int | None) -> "HeadSet":
        if k is None or k >= len(self.heads):
            return self
        return HeadSet(self.model, self.heads[:k], self.mrr[:k], self.random_mrr, self.method, self.samples, self.meta, self.fingerprint)

    def to_json(self) -> str:
        d = asdict(self)
        d["heads"] = [list(h) for h in self.heads]
        if not d["fingerprint"]:
            d.pop("fingerprint")
        return json.dumps(d, indent=1)

    def save(self, path: str | os.PathLike[str]) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(self.to_json() + "\n")
        return p

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "HeadSet":
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"head-set file not found: {p}")
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p} is not a head-set JSON file: {exc}") from None
        if not isinstance(d, dict) or "heads" not in d:
            raise ValueError(f"{p} is not a head-set JSON file (no 'heads' list)")
        return cls(**d)


def _key(model_name: str) -> str:
    """File-name stem of a head set stored by name only (before fingerprints)."""
    return model_name.strip().lower().replace("/", "--")


def user_head_dir() -> Path:
    """Where ``qgpm calibrate`` writes head sets for the user (``$QGPM_HOME/heads``)."""
    home = os.environ.get("QGPM_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "qgpm")
    return Path(home) / "heads"


def shipped_head_dir() -> Path:
    """The head sets shipped with the package (``qgpm/data/heads``)."""
    return Path(str(resources.files("qgpm") / "data" / "heads"))


def head_set_file_name(fp: ModelFingerprint) -> str:
    """``<readable-name>--<key>[-<weights>].json``: where ``qgpm calibrate`` stores a set."""
    weights = f"-{fp.weights[:8]}" if fp.weights else ""
    return f"{slug(fp.name)}--{fp.key}{weights}.json"


_INDEX: dict[Path, tuple[float, dict | None, str]] = {}
_INDEX_LOCK = threading.Lock()


def _stored() -> list[tuple[Path, dict | None, str]]:
    """``(path, fingerprint dict or None, model name)`` of every stored set: user folder first."""
    out = []
    with _INDEX_LOCK:
        for folder in (user_head_dir(), shipped_head_dir()):
            if not folder.is_dir():
                continue
            for p in sorted(folder.glob("*.json")):
                try:
                    mtime = p.stat().st_mtime
                except OSError:
                    continue
                hit = _INDEX.get(p)
                if hit is None or hit[0] != mtime:
                    try:
                        d = json.loads(p.read_text())
                        hit = (mtime, d.get("fingerprint") or None, str(d.get("model", "")))
                    except (OSError, ValueError, AttributeError) as exc:  # once per file version: the index keeps its mtime
                        logger.warning("qgpm: skipping head-set file %s, which is not a readable head set (%s: %s); "
                                       "delete it or calibrate again", p, type(exc).__name__, exc)
                        hit = (mtime, None, "")
                    _INDEX[p] = hit
                out.append((p, hit[1], hit[2]))
    return out


def find_head_set(fp: ModelFingerprint) -> tuple[HeadSet, Path] | None:
    """The stored head set for the model with fingerprint ``fp``, or ``None``.

    Among stored sets with ``fp.key``: one calibrated on the same weights first, the
    user folder before the shipped sets. A set calibrated on other weights is used with
    a warning. Sets stored before fingerprints existed are matched by model name (with
    a warning) only when no set carries the key.
    """
    same_key = [(p, f) for p, f, _ in _stored() if f and f.get("key") == fp.key]
    exact = [(p, f) for p, f in same_key if fp.same_weights(f)]
    if exact or same_key:
        path, f = (exact or same_key)[0]
        if not exact and fp.weights and f.get("weights"):
            logger.warning(
                "using head set %s, calibrated on other weights of the same architecture and tokenizer "
                "(%s; another fine-tune or a quantized copy). Calibrate this model's own heads with "
                "`qgpm calibrate --model <id-or-path>` if its answers look off.", path, f.get("name") or "?",
            )
        return HeadSet.load(path), path
    if fp.name:
        for p, f, _ in _stored():
            if f is None and p.stem == _key(fp.name):
                logger.warning(
                    "head set %s carries no model fingerprint; it is used because its file name matches the model "
                    "name %r. Recalibrate (`qgpm calibrate --model <id-or-path>`) to store a fingerprinted set.", p, fp.name,
                )
                return HeadSet.load(p), p
    return None


def has_head_set_for_shape(shape: dict) -> bool:
    """Whether any stored, fingerprinted head set was made for a model of this shape
    (:data:`~qgpm.fingerprint.SHAPE_FIELDS`). ``False`` means no stored set can fit."""
    for _, f, _ in _stored():
        arch = (f or {}).get("arch") or {}
        if all(arch.get(k) == v for k, v in shape.items()):
            return True
    return any(f is None for _, f, _ in _stored())  # a legacy set might fit: no conclusion


def known_model_name(key: str) -> str | None:
    """The readable name stored beside fingerprint ``key`` (a preset or a stored head set)."""
    if key in PRESET_NAMES:
        return PRESET_NAMES[key]
    for _, f, name in _stored():
        if f and f.get("key") == key:
            return f.get("name") or name or None
    return None


def check_head_set(hs: HeadSet, fp: ModelFingerprint, source: str = "the head set") -> None:
    """Raise :class:`HeadSetMismatchError` when ``hs`` was made for another model."""
    if hs.key is None or hs.key == fp.key:
        return
    theirs = ModelFingerprint.from_dict(hs.fingerprint)
    diffs = [f"{k}: {theirs.arch.get(k)} vs {fp.arch.get(k)}" for k in sorted(set(theirs.arch) | set(fp.arch)) if theirs.arch.get(k) != fp.arch.get(k)]
    if theirs.tokenizer != fp.tokenizer:
        diffs.append("tokenizer vocabulary differs")
    raise HeadSetMismatchError(
        f"{source} was made for another model: {theirs.describe()}, but this model is {fp.describe()} "
        f"({'; '.join(diffs) or 'fingerprints differ'}). Calibrate heads for this model with "
        "`qgpm calibrate --model <id-or-path>` or heads='calibrate', or pass heads=[(layer, head), ...] "
        "to use chosen heads without the check."
    )


def choose_head_set(heads: Any, fp: ModelFingerprint, name: str) -> HeadSet | HeadSetMissingError:
    """The head set ``heads`` names for the model ``fp`` (called ``name``): a :class:`HeadSet`
    (checked against ``fp``), ``None`` (the stored set, or the :class:`HeadSetMissingError` to
    raise when a call needs one), a head-set file, or ``(layer, head)`` pairs taken as given.
    A set made for another model raises :class:`HeadSetMismatchError`."""
    if isinstance(heads, HeadSet):
        check_head_set(heads, fp)
        return heads
    if heads is None:
        found = find_head_set(fp)
        if found is None:
            return missing_head_set_error(fp)
        check_head_set(found[0], fp, f"the stored head set {found[1]}")
        return found[0]
    if isinstance(heads, (str, os.PathLike)):
        hs = HeadSet.load(heads)
        check_head_set(hs, fp, f"head set {heads}")
        return hs
    if not isinstance(heads, Iterable) or isinstance(heads, (bytes, Mapping)):
        raise TypeError(f"heads= takes None (the stored set), 'calibrate', a head-set JSON path, a HeadSet or a list of "
                        f"(layer, head) pairs; got {type(heads).__name__} {heads!r}")
    return HeadSet(name, list(heads), method="given by caller", fingerprint=fp.to_dict())


def stored_head_set_path(model: str | ModelFingerprint) -> Path | None:
    """The stored head-set file for a model fingerprint, or (by readable name) for a model name."""
    if isinstance(model, ModelFingerprint):
        hit = find_head_set(model)
        return None if hit is None else hit[1]
    stem = _key(model)
    for p, f, name in _stored():
        if p.stem == stem or (f and _key(f.get("name") or name) == stem) or (f is None and _key(name) == stem):
            return p
    return None


def load_head_set(model: str | ModelFingerprint) -> HeadSet:
    """The stored head set of a model (fingerprint, or readable name), or raise :class:`HeadSetMissingError`."""
    path = stored_head_set_path(model)
    if path is None:
        raise missing_head_set_error(model)
    return HeadSet.load(path)


def missing_head_set_error(model: str | ModelFingerprint) -> HeadSetMissingError:
    """The error for a model without a stored head set, saying how to make one."""
    name = model.describe() if isinstance(model, ModelFingerprint) else f"'{model}'"
    return HeadSetMissingError(
        f"no head set is stored for model {name}. Calibrate one with "
        f"`qgpm calibrate --model <id-or-path>` (writes to {user_head_dir()}), call "
        "QGPM.from_pretrained(..., heads='calibrate') to calibrate now, or pass heads=[(layer, head), ...]; "
        "or rank sentences with relevance='minilm' (a QGPMConfig field, also an argument of the adapters): "
        "a reranker, which needs no head set."
    )


def parse_heads(spec: Any) -> Any:
    """A head-set argument from text: ``None`` / ``"stored"`` (the stored set), ``"calibrate"``,
    a head-set JSON path, or ``"14:3,15:6"`` (a list of ``(layer, head)``); non-strings pass through."""
    if spec is None or not isinstance(spec, str):
        return spec
    s = spec.strip()
    if not s or s.lower() in {"stored", "default", "none"}:
        return None
    if s == "calibrate" or os.path.exists(s) or s.endswith(".json"):
        return s
    pairs = []
    for part in s.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        layer, _, head = part.partition(":")
        try:
            pairs.append((int(layer), int(head)))
        except ValueError:
            raise ValueError(f"bad head {part!r}: expected layer:head, e.g. 14:3 (or a head-set JSON file, 'stored' or 'calibrate')") from None
    if not pairs:
        raise ValueError(f"no heads in {spec!r}: expected layer:head,... e.g. 14:3,15:6")
    return pairs


def reciprocal_rank(scores: torch.Tensor, gold: Iterable[int]) -> float:
    """1 / rank of the best gold unit under ``scores`` (higher = better), ties at expected rank.

    With ``a`` units scoring strictly higher than the best gold unit and ``t`` units that are
    not gold tied with it, the expected rank is ``a + 1 + t / 2``. Another gold unit tied with
    it is no competitor: a gold unit ranks first either way.
    """
    gold = sorted(set(gold))
    if not gold:
        raise ValueError("reciprocal_rank needs at least one gold index")
    s = scores.to(torch.float64)
    best = max(float(s[g]) for g in gold)
    higher = int((s > best).sum())
    others = torch.ones(s.numel(), dtype=torch.bool)
    others[gold] = False
    ties = int((s[others] == best).sum())
    return 1.0 / (higher + 1 + ties / 2)
