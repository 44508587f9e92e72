"""Query-agnostic baselines the paper compares QGPM with: STRING, Ms-PoE, Self-Extend
(RoPE changes) and LLMLingua-2 (input compression).

The RoPE baselines change positions inside attention without looking at the question,
training nothing:

- ``string`` (:class:`StringOptions`): relative distance ``d`` stays below ``S`` and
  becomes ``d - S + W`` at or beyond it (``S = N/3``, ``W = 128``).
- ``ms-poe`` (:class:`MsPoEOptions`): per-head position ratios from 1.2 to 1.8, ordered
  by an outlier-based position-awareness score; all layers but the first two.
- ``self-extend`` (:class:`SelfExtendOptions`): neighbour window ``W`` at standard
  positions, grouped positions (group size ``G``) beyond it.

Use them like any other method: ``engine.answer(ctx, q, method="string",
options=StringOptions(...))``. Each runs as a custom attention function registered through
transformers' ``AttentionInterface`` for the duration of the call
(:mod:`qgpm.baselines.attention`), with eager or sdpa models, ``generate()`` and the KV cache.

``llmlingua-2`` (:class:`LLMLingua2Options`, :mod:`qgpm.baselines.llmlingua`) compresses
the context with a token classifier whose weights the user supplies, then answers with
standard RoPE; it needs the ``llmlingua`` package.

This module is the one place that lists them (:data:`BASELINE_OPTIONS`: method -> options
class; :data:`ROPE_BASELINES`: those that act inside attention).
"""

from __future__ import annotations

import codecs
from dataclasses import fields
from typing import Any

from .options import STRING_RELEASED_SCALE, LLMLingua2Options, MsPoEOptions, SelfExtendOptions, StringOptions
from .plans import BaselinePlan, build_baseline_plan
from ..config_files import coerce_value

__all__ = [
    "BASELINE_METHODS",
    "BASELINE_OPTIONS",
    "ROPE_BASELINES",
    "LLMLingua2Options",
    "BaselineOptions",
    "StringOptions",
    "MsPoEOptions",
    "SelfExtendOptions",
    "STRING_RELEASED_SCALE",
    "BaselinePlan",
    "build_baseline_plan",
    "resolve_options",
    "options_from_strings",
]

BaselineOptions = StringOptions | MsPoEOptions | SelfExtendOptions | LLMLingua2Options

from ..methods import BASELINE_METHODS, ROPE_BASELINES  # noqa: E402

BASELINE_OPTIONS: dict[str, type] = {
    "string": StringOptions,
    "ms-poe": MsPoEOptions,
    "self-extend": SelfExtendOptions,
    "llmlingua-2": LLMLingua2Options,
}
"""Method name -> its options class: the registration of the query-agnostic baselines."""

if tuple(BASELINE_OPTIONS) != BASELINE_METHODS:  # pragma: no cover - a programming error, caught on import
    raise RuntimeError(f"the method specs' baselines {BASELINE_METHODS} != the baselines with options {tuple(BASELINE_OPTIONS)}")


def resolve_options(method: str, options: Any) -> BaselineOptions | None:
    """The options a call of ``method`` runs with (``None`` for a method that takes none).

    ``options=None`` gives the method's defaults (``llmlingua-2`` has none: it needs the
    compressor's path). Options of another method, or options for a method that takes
    none, raise rather than being ignored.
    """
    cls = BASELINE_OPTIONS.get(method)
    if cls is None:
        if options is not None:
            raise ValueError(
                f"options= configures the RoPE baselines ({', '.join(BASELINE_METHODS)}); method={method!r} takes none. "
                "QGPM's own settings go in config=QGPMConfig(...)."
            )
        return None
    if options is None:
        return cls()
    if isinstance(options, dict):
        return cls(**options)
    if not isinstance(options, cls):
        raise TypeError(f"method={method!r} takes options={cls.__name__}(...), got {type(options).__name__}")
    return options


def options_from_strings(specs: list[str] | tuple[str, ...]) -> dict[str, BaselineOptions]:
    """Options per method from ``"method.field=value"`` strings (the eval CLI's ``--option``),
    e.g. ``["string.local_window=256", "self-extend.group_size=4"]``."""
    changes: dict[str, dict[str, Any]] = {}
    for spec in specs:
        name, eq, value = spec.partition("=")
        method, dot, fld = name.strip().rpartition(".")
        if not eq or not dot:
            raise ValueError(f"bad option {spec!r}: expected method.field=value, e.g. string.local_window=256")
        cls = BASELINE_OPTIONS.get(method)
        if cls is None:
            raise ValueError(f"bad option {spec!r}: {method!r} is not one of {', '.join(BASELINE_METHODS)}")
        if fld not in cls.field_names():
            raise ValueError(f"bad option {spec!r}: {cls.__name__} has no field {fld!r}; fields: {', '.join(cls.field_names())}")
        default = {f.name: f.default for f in fields(cls)}[fld]
        if isinstance(default, tuple):  # e.g. llmlingua-2.force_tokens=\n,?
            changes.setdefault(method, {})[fld] = tuple(codecs.decode(v, "unicode_escape") for v in value.split(","))
        else:
            changes.setdefault(method, {})[fld] = coerce_value(value)
    return {m: BASELINE_OPTIONS[m](**kw) for m, kw in changes.items()}
