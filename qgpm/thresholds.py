"""The flat-relevance threshold that ``QGPMConfig.min_top_z="calibrated"`` stands for.

The confidence rule compares the top sentence's relevance z with a threshold, and z is on
its source's own scale (:mod:`qgpm.sources`): the heads' fused z is in one model's units, so
their threshold is calibrated with the model's head set and stored in it
(:attr:`qgpm.heads.HeadSet.min_top_z`); a reranker scores the same sentences alike whatever
model answers, so its threshold is calibrated once and shipped with the package
(``qgpm/data/relevance/<reranker>.json``). Both come from the same procedure,
:func:`qgpm.calibrate.flat_relevance_threshold` (``scripts/confidence_threshold.py``).
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from .rerank import reranker_key
from .sources import parse_source

__all__ = ["RERANKER_CONFIDENCE_DIR", "reranker_confidence", "calibrated_min_top_z"]

RERANKER_CONFIDENCE_DIR = "data/relevance"
"""Where the rerankers' calibrated thresholds live inside the package: ``<reranker key>.json``,
as ``scripts/confidence_threshold.py --relevance <reranker> --write`` writes it."""


def reranker_confidence(reranker: str) -> dict[str, Any] | None:
    """The stored flat-relevance calibration of a reranker source (``min_top_z`` with the top z
    values and the command behind it), or ``None`` when the package ships none for it. Read once
    per process (every call with ``min_top_z="calibrated"`` resolves through it); do not modify
    the returned mapping."""
    return _shipped_confidence(reranker_key(reranker))


@functools.cache
def _shipped_confidence(key: str) -> dict[str, Any] | None:
    if not key.replace("-", "").replace("_", "").isalnum():  # a spec with a path: no shipped file
        return None
    path = resources.files("qgpm").joinpath(f"{RERANKER_CONFIDENCE_DIR}/{key}.json")
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def calibrated_min_top_z(relevance: Any, head_set: Any) -> tuple[float | None, str | None]:
    """The threshold ``min_top_z="calibrated"`` stands for with the source ``relevance``: the
    head set's for ``"heads"``, the reranker's stored one for a reranker. ``(value, None)``, or
    ``(None, why)`` when there is none (the rule is then off; the caller says so)."""
    source = parse_source(relevance)
    if source.heads and source.reranker is not None:
        return None, f"relevance={source.spec!r} fuses two z scales and no threshold is calibrated for the fusion"
    if source.heads:
        value = head_set.min_top_z if head_set is not None else None
        if value is not None:
            return value, None
        record = head_set.meta.get("confidence") if head_set is not None else None
        if isinstance(record, dict) and "found_top_z" in record:  # calibrated, and no cut separated its samples
            return None, ("the model's head set was calibrated but no threshold separated its samples (qgpm calibrate said why): "
                          "set min_top_z to a z value yourself, or calibrate on more samples (--n, --holdout)")
        return None, "the model's head set stores no calibrated threshold (recalibrate it: qgpm calibrate)"
    stored = reranker_confidence(source.reranker)
    value = None if stored is None else stored.get("min_top_z")
    if value is None:
        return None, (f"no threshold is calibrated for the reranker {source.reranker!r} "
                      f"(python scripts/confidence_threshold.py --relevance {source.reranker} --write)")
    return float(value), None
