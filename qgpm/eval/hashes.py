"""What decides a method's answer, hashed into a row's ``config_hash``.

The fingerprint names the model, dtype, generation budget, haystack and stop strings for every
method, plus the QGPM config (qgpm, oracle), the head set where the engine has one and the calibrated threshold (qgpm),
the reranker and ``k`` (topk, reorder) and a baseline's options (RoPE baselines, LLMLingua-2). A vanilla row therefore
stays valid when only the QGPM config changes; config fields added after rows were committed
are hashed only when set, so earlier rows keep their hashes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from qgpm.baselines import BASELINE_METHODS, resolve_options
from qgpm.config import CALIBRATED
from qgpm.defaults import DEFAULT_K, DEFAULT_RERANKER
from qgpm.eval.answering import answer_stop, options_for
from qgpm.heads import HeadSetMissingError
from qgpm.methods import Stage, method_spec
from qgpm.sources import parse_source
from qgpm.thresholds import calibrated_min_top_z

__all__ = ["method_fingerprint", "config_hash", "config_dict", "config_value", "check_options", "engine_dtype", "engine_heads", "reranker_name"]


def engine_dtype(engine) -> str:
    """The dtype name of ``engine``'s weights (``"bfloat16"``, ...), ``"?"`` when it has none."""
    try:
        return str(next(engine.model.parameters()).dtype).replace("torch.", "")
    except (StopIteration, AttributeError):
        return "?"


def reranker_name(reranker: Any) -> str:
    if reranker is None:
        return DEFAULT_RERANKER  # what the engine uses for None
    return str(getattr(reranker, "name", reranker))


# Config fields added after rows were first committed: hashed only when they are not at
# their "off" value, so rows made before they existed keep their config_hash.
_HASHED_WHEN_SET = {"local_window": 0.0, "keep_length": 0.0, "unmodulated_layers": 0, "anchor_basis": "context", "min_top_z": None,
                    "decisive_margin": None, "remap": "stride", "z_window": None,
                    "lead_tokens": 0, "solo_margin": None, "placement": "question", "local_layers": None, "term_ratio": None,
                    "moved_order": "rank", "split_run_ons": False, "pass1_dtype": None, "relevance": "heads"}


def config_dict(config) -> dict:
    d = dataclasses.asdict(config)
    d.pop("provenance", None)
    for name, off in _HASHED_WHEN_SET.items():
        if d.get(name) == off:
            d.pop(name, None)
    return d


def config_value(stored: dict, name: str) -> Any:
    """A field of a config stored by :func:`config_dict`: its value, or the value it had when
    :func:`config_dict` left it out (the field's "off" setting, e.g. ``relevance="heads"``)."""
    return stored[name] if name in stored else _HASHED_WHEN_SET.get(name)


def method_fingerprint(
    engine,
    method: str,
    *,
    config=None,
    reranker: Any = DEFAULT_RERANKER,
    k: int = DEFAULT_K,
    max_new_tokens: int | None = None,
    haystack: Any = None,
    options: Any = None,
) -> dict:
    """What decides ``method``'s answer on a sample (hashed into ``config_hash``).

    ``options``: a ``{method: options}`` mapping (or one baseline's options object); a
    baseline absent from it runs with its defaults. Baseline rows hash every option field."""
    fp: dict[str, Any] = {
        "method": method,
        "model": engine.name,
        "dtype": engine_dtype(engine),
        "max_new_tokens": max_new_tokens,
        "haystack": None if haystack is None else str(getattr(haystack, "__name__", haystack)),
    }
    cfg = config or engine.config
    spec = method_spec(method)
    if spec.config:
        fp["config"] = config_dict(cfg)
    if spec.stage is Stage.HEADS:
        heads = engine_heads(engine)
        if heads is not None:
            fp["heads"] = heads
        elif parse_source(cfg.relevance).heads:  # no head set, and this config reads one: the engine's error, before any row
            engine.heads
        if cfg.min_top_z == CALIBRATED:  # the threshold it stands for with this source (and this engine's head set)
            fp["calibrated_min_top_z"] = calibrated_min_top_z(cfg.relevance, engine.head_set)[0]
        low = engine.pass1_precision(cfg)
        if low is not None:  # what "auto" became on this hardware; absent at the model's dtype (earlier rows keep their hashes)
            fp["pass1_precision"] = str(low).removeprefix("torch.")
    if spec.reranker:
        fp["reranker"] = reranker_name(reranker)
        fp["k"] = int(k)
    if spec.options:
        fp["options"] = resolve_options(method, options_for(method, options)).to_dict()
    stop = answer_stop(engine)
    if stop:  # absent for chat models (earlier rows keep their hashes)
        fp["stop"] = list(stop)
    generator = getattr(getattr(engine, "generator", None), "name", "transformers")
    if generator != "transformers":  # absent for this process's own generator (earlier rows keep their hashes)
        fp["generator"] = generator
    return fp


def engine_heads(engine: Any) -> list[list[int]] | None:
    """The heads ``engine`` reads in pass 1, as lists; ``None`` for an engine without a head set
    (a model nobody calibrated runs the recipe, which ranks with MiniLM)."""
    try:
        return [list(h) for h in engine.heads]
    except HeadSetMissingError:
        return None


def check_options(options: Any) -> dict:
    """Validate a ``{method: options}`` mapping for :func:`run_eval` (each value an options
    object of that method, or a dict of its fields); returns it with objects as values."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(f"options must map method names to options, e.g. {{'string': StringOptions(...)}}, got {type(options).__name__}")
    bad = [m for m in options if m not in BASELINE_METHODS]
    if bad:
        raise ValueError(f"options given for {bad}: only {', '.join(BASELINE_METHODS)} take options")
    return {m: resolve_options(m, o) for m, o in options.items()}


def config_hash(fingerprint: dict) -> str:
    return hashlib.sha1(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()[:12]

