"""QGPM's settings in four typed groups: pass 1, shaping, the confidence rules, and the remap
with its own options.

:class:`qgpm.QGPMConfig` keeps every setting as one flat field (what ``cfg.k_sharp``,
``with_()``, ``to_dict()`` and the evaluation harness's config hashes read). These groups are
its structure: ``cfg.pass1``, ``cfg.shaping``, ``cfg.confidence`` and ``cfg.remap_settings``
return them, and :meth:`QGPMConfig.from_groups <qgpm.QGPMConfig.from_groups>` builds a config
from them. What each field does: the attribute of the same name on :class:`qgpm.QGPMConfig`.

* A group holds only settings that can be combined. Each remap carries its own options: the
  options of moved sentences (``lead_tokens``, ``placement``, ``moved_order``) are fields of
  :class:`MoveRemap` and :class:`ReorderRemap`, not of :class:`StrideRemap`, so
  ``StrideRemap(lead_tokens=64)`` is a ``TypeError``. Settings that one remap ignores but none
  rejects (the frequency gate and ``eps`` under ``reorder``) stay in :class:`ShapingSettings`.
* Each group checks its own fields when it is built (``TypeError`` for a wrong type,
  ``ValueError`` for a value out of range, naming the field). :class:`qgpm.QGPMConfig` runs
  the same checks by building its groups, and :func:`remap_of` refuses a moved-sentence
  option under ``remap="stride"``.
* Each group says once, in ``REPLANNABLE``, whether :meth:`qgpm.QGPM.replan` may change its
  fields on a prepared call (``False``: they change pass 1 or the prompt). The lists
  :data:`qgpm.defaults.PASS1_FIELDS` and :data:`REPLANNABLE_FIELDS` are read from it.
* A group's defaults are the defaults of :class:`qgpm.QGPMConfig` (its fields take them from
  here), so ``QGPMConfig.from_groups()`` equals ``QGPMConfig()``.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

from .field_checks import check_types, z_margin
from .sources import parse_source

__all__ = [
    "Pass1Settings",
    "ShapingSettings",
    "ConfidenceRules",
    "StrideRemap",
    "MoveRemap",
    "ReorderRemap",
    "RemapSettings",
    "REMAPS",
    "SETTING_GROUPS",
    "REPLANNABLE_FIELDS",
    "CALIBRATED",
    "MIN_SENTENCE_CHARS",
    "fields_of",
    "check_groups",
    "group_of",
    "remap_of",
    "flat_fields",
]

CALIBRATED = "calibrated"
"""``QGPMConfig.min_top_z`` value: the threshold calibrated on the relevance source's z scale
(MiniLM's shipped one for ``"minilm"``, the one stored with the model's head set for the heads;
:func:`qgpm.thresholds.calibrated_min_top_z`)."""

MIN_SENTENCE_CHARS = 20
"""Smallest ``max_sentence_chars`` the sentence splitter accepts."""

Pass1Dtype = Literal["auto", "bfloat16", "float16", "float32"]
AnchorBasis = Literal["context", "relevant"]
LocalLayers = Literal["vanilla", "modulated"]
Placement = Literal["question", "ends"]
MovedOrder = Literal["rank", "text"]


# ----------------------------------------------------------------------------- the groups


@functools.cache
def _names(cls: type) -> tuple[str, ...]:
    """The field names of the dataclass ``cls``, in order."""
    return tuple(f.name for f in fields(cls))


def _unknown_field(group: type, name: str) -> str:
    """Why ``name`` is not a field of ``group``, and where it belongs."""
    owners = [g.__name__ for g in SETTING_GROUPS if name in _names(g)]
    if name == "remap":
        where = "the remap is the group itself: pass StrideRemap(), MoveRemap(...) or ReorderRemap(...)"
    elif owners:
        where = f"it is a field of {' and '.join(owners)}"
    else:
        where = "it is not a QGPM setting"
    return f"{group.__name__} has no field {name!r} ({where}); its fields: {', '.join(_names(group)) or 'none'}"


def _group(cls: type) -> type:
    """A frozen dataclass whose constructor names the group an unknown keyword belongs to."""
    cls = dataclass(frozen=True)(cls)
    init = cls.__init__
    known = frozenset(_names(cls))

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for name in kwargs:
            if name not in known:
                raise TypeError(_unknown_field(cls, name))
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]
    return cls


@_group
class Pass1Settings:
    """What pass 1 computes and over which sentences: the sentence splitter, the query rows,
    the heads, pass 1's precision and the relevance source. Changing any of them needs a new
    :meth:`qgpm.QGPM.prepare`."""

    REPLANNABLE: ClassVar[bool] = False

    max_sentence_chars: int = 600
    split_run_ons: bool = False
    query_tail: int | None = None
    exclude_newline_tokens: bool = True
    max_heads: int | None = None
    pass1_dtype: Pass1Dtype | None = None
    relevance: str = "heads"

    def __post_init__(self) -> None:
        check_types(self)
        if self.pass1_dtype not in (None, "auto", "bfloat16", "float16", "float32"):
            raise ValueError(f"pass1_dtype must be None (the model's dtype), 'auto', 'bfloat16', 'float16' or 'float32', got {self.pass1_dtype!r}")
        parse_source(self.relevance)
        if self.query_tail is not None and self.query_tail < 0:
            raise ValueError(f"query_tail must be >= 0 (or None = every token after the question), got {self.query_tail}")
        if self.max_heads is not None and self.max_heads < 1:
            raise ValueError(f"max_heads must be >= 1, got {self.max_heads}")
        if self.max_sentence_chars < MIN_SENTENCE_CHARS:
            raise ValueError(f"max_sentence_chars must be at least {MIN_SENTENCE_CHARS}, got {self.max_sentence_chars}")


@_group
class ShapingSettings:
    """How a ranking becomes scores and where they act: the two maps (Eq. 6), the low score,
    the stride floor, the frequency gate (Eq. 3, 7) and the layers each map covers."""

    REPLANNABLE: ClassVar[bool] = True

    k_broad: float = 8.0
    t_broad: float = 2.0
    k_sharp: float = 2.0
    t_sharp: float = 0.5
    s_low: float = 0.1
    eps: float = 0.05
    anchor_ratio: float = 1.0
    tau: float = 1.0
    anchor_basis: AnchorBasis = "context"
    local_window: float = 0.0
    unmodulated_layers: int = 0
    split_layer: int | None = None

    def __post_init__(self) -> None:
        check_types(self)
        if not self.k_broad > self.k_sharp > 0:
            raise ValueError(f"need K_b > K_s > 0, got K_b={self.k_broad}, K_s={self.k_sharp}")
        if self.t_broad < self.t_sharp or self.t_sharp < 0:
            raise ValueError(f"need T_b >= T_s >= 0, got T_b={self.t_broad}, T_s={self.t_sharp}")
        if not 0 <= self.s_low <= 1:
            raise ValueError(f"s_low must be in [0, 1], got {self.s_low}")
        if not 0 < self.eps <= 1:
            raise ValueError(f"eps must be in (0, 1], got {self.eps}")
        if self.anchor_ratio <= 0:
            raise ValueError(f"anchor_ratio must be positive, got {self.anchor_ratio}")
        if self.tau < 0:
            raise ValueError(f"tau must be >= 0, got {self.tau}")
        if self.anchor_basis not in ("context", "relevant"):
            raise ValueError(f"anchor_basis must be 'context' or 'relevant', got {self.anchor_basis!r}")
        if not self.local_window >= 0:
            raise ValueError(f"local_window must be >= 0 tokens (0 = off), got {self.local_window}")
        if self.unmodulated_layers < 0:
            raise ValueError(f"unmodulated_layers must be >= 0, got {self.unmodulated_layers}")
        if self.split_layer is not None and self.split_layer < 0:
            raise ValueError(f"split_layer must be >= 0 (or None = half the layers), got {self.split_layer}")


@_group
class ConfidenceRules:
    """The rules that read the ranking before it is shaped: when a call keeps vanilla positions
    (a short context, flat or decisive relevance), when the top sentence is promoted alone,
    and which of each map's top ``K`` sentences stay relevant (the z window, the query-term
    filter). Each is off at its default, except that a relevance ranking no sentence above
    another always keeps vanilla positions."""

    REPLANNABLE: ClassVar[bool] = True

    keep_length: float = 0.0
    min_top_z: float | Literal["calibrated"] | None = None
    decisive_margin: float | None = None
    solo_margin: float | None = None
    z_window: float | None = None
    term_ratio: float | None = None

    def __post_init__(self) -> None:
        check_types(self)
        if not self.keep_length >= 0:
            raise ValueError(f"keep_length must be >= 0 tokens (0 = off), got {self.keep_length}")
        z = self.min_top_z
        if (z != CALIBRATED if isinstance(z, str) else
                z is not None and (isinstance(z, bool) or not isinstance(z, numbers.Real) or not math.isfinite(z))):
            raise ValueError(f"min_top_z must be a finite z-score, {CALIBRATED!r} (the threshold calibrated for the relevance source: MiniLM's shipped one, or the head set's for the heads) or None, got {z!r}")
        for name in ("decisive_margin", "z_window", "solo_margin"):
            z_margin(name, getattr(self, name))
        if self.term_ratio is not None and not (math.isfinite(self.term_ratio) and 0 < self.term_ratio <= 1):
            raise ValueError(f"term_ratio must be in (0, 1] (a share of the best candidate's BM25 score) or None (off), got {self.term_ratio}")


def _check_local_layers(value: Any) -> None:
    if value not in (None, "vanilla", "modulated"):
        raise ValueError(f"local_layers must be None (the remap's choice), 'vanilla' or 'modulated', got {value!r}")


@_group
class StrideRemap:
    """``remap="stride"`` (the paper's Eq. 7-8): low scores shorten the strides of irrelevant
    tokens on the modulated planes. Nothing is moved, so it takes no option of moved sentences."""

    REMAP: ClassVar[str] = "stride"
    REPLANNABLE: ClassVar[bool] = True

    local_layers: LocalLayers | None = None

    def __post_init__(self) -> None:
        _check_local_layers(self.local_layers)


@dataclass(frozen=True)
class _MovingRemap:
    """The options of the remaps that move sentences (:class:`MoveRemap`, :class:`ReorderRemap`)."""

    REPLANNABLE: ClassVar[bool] = True

    local_layers: LocalLayers | None = None
    lead_tokens: int = 0
    placement: Placement = "question"
    moved_order: MovedOrder = "rank"

    def __post_init__(self) -> None:
        check_types(self)
        if self.lead_tokens < 0:
            raise ValueError(f"lead_tokens must be >= 0 tokens (0 = off), got {self.lead_tokens}")
        _check_local_layers(self.local_layers)
        if self.placement not in ("question", "ends"):
            raise ValueError(f"placement must be 'question' (moved sentences before the question) or 'ends' (split between both ends of the context), got {self.placement!r}")
        if self.placement != "question" and self.lead_tokens:
            raise ValueError(f"placement={self.placement!r} and lead_tokens={self.lead_tokens} cannot be combined (leads are defined for sentences moved before the question only); set one of them")
        if self.moved_order not in ("rank", "text"):
            raise ValueError(f"moved_order must be 'rank' (the top sentence last, next to the question) or 'text' (the context's order), got {self.moved_order!r}")
        if self.moved_order != "rank" and self.placement != "question":
            raise ValueError(f"moved_order={self.moved_order!r} and placement={self.placement!r} cannot be combined (placement='ends' splits the moved sentences by rank); set one of them")


@_group
class MoveRemap(_MovingRemap):
    """``remap="move"``: each map's relevant sentences take the last context slots on the
    modulated planes; the slow planes and the causal order keep the text order."""

    REMAP: ClassVar[str] = "move"


@_group
class ReorderRemap(_MovingRemap):
    """``remap="reorder"``: the move on every plane, with the causal order following it; pass 2
    reads the prompt with the moved sentences physically before the question, on every layer,
    so ``local_layers`` is ``None`` or ``"modulated"``."""

    REMAP: ClassVar[str] = "reorder"

    local_layers: Literal["modulated"] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.local_layers == "vanilla":
            raise ValueError("local_layers='vanilla' cannot be kept by remap='reorder': its pass 2 feeds the reordered prompt to every layer; "
                             "use local_layers=None or 'modulated', or remap='stride' / 'move'")


RemapSettings = StrideRemap | MoveRemap | ReorderRemap
"""One of the remaps, with its own options."""

REMAPS: dict[str, type] = {cls.REMAP: cls for cls in (StrideRemap, MoveRemap, ReorderRemap)}
"""Each ``QGPMConfig.remap`` value and its group."""

SETTING_GROUPS: tuple[type, ...] = (Pass1Settings, ShapingSettings, ConfidenceRules, StrideRemap, MoveRemap, ReorderRemap)
"""Every group; their fields, with ``remap`` (the remap's name) and ``provenance``, are the
fields of :class:`qgpm.QGPMConfig`."""

_MOVED_ONLY = {"lead_tokens": "moves text along with moved sentences", "placement": "places moved sentences",
               "moved_order": "orders moved sentences"}
"""The moving remaps' options that :class:`StrideRemap` lacks, and what each does."""


def fields_of(*, replannable: bool) -> tuple[str, ...]:
    """The flat field names of the groups whose ``REPLANNABLE`` is ``replannable``, in group
    order (``remap``, the remap's name, with the replannable ones)."""
    names: list[str] = []
    for group in SETTING_GROUPS:
        if group.REPLANNABLE == replannable:
            names += [f.name for f in fields(group) if f.name not in names]
            if group in REMAPS.values() and "remap" not in names:
                names.append("remap")
    return tuple(names)


REPLANNABLE_FIELDS: tuple[str, ...] = fields_of(replannable=True)
"""``QGPMConfig`` fields that :meth:`qgpm.QGPM.replan` may change without a new pass 1."""


# ----------------------------------------------------------------------------- flat <-> groups


def group_of(group: type, flat: Any) -> Any:
    """``group`` (a group class) with its fields read from the flat config ``flat``; the
    remap group of a config is :func:`remap_of`."""
    return group(**{name: getattr(flat, name) for name in _names(group)})


def remap_of(flat: Any) -> RemapSettings:
    """The remap group of the flat config ``flat``: its ``remap`` with that remap's options.

    Under ``remap="stride"`` the options of moved sentences must be at their defaults: each
    is checked as :class:`MoveRemap` checks it, then a set one raises ``ValueError``."""
    group = REMAPS.get(flat.remap) if isinstance(flat.remap, str) else None
    if group is None:
        raise ValueError(f"remap must be 'stride' (the paper's Eq. 7-8), 'move' or 'reorder', got {flat.remap!r}")
    options = group_of(MoveRemap, flat)
    if group is not StrideRemap:
        return group(**{name: getattr(options, name) for name in _names(MoveRemap)})
    default = MoveRemap()
    for name, what in _MOVED_ONLY.items():
        if getattr(options, name) != getattr(default, name):
            raise ValueError(f"{name}={getattr(options, name)!r} {what}; it needs remap='move' or 'reorder', not 'stride'")
    return StrideRemap(local_layers=options.local_layers)


def check_groups(flat: Any) -> None:
    """Build every group of the flat config ``flat``, so that each checks its fields."""
    group_of(ShapingSettings, flat)
    group_of(ConfidenceRules, flat)
    remap_of(flat)
    group_of(Pass1Settings, flat)


def flat_fields(*, pass1: Pass1Settings | None = None, shaping: ShapingSettings | None = None,
                confidence: ConfidenceRules | None = None, remap: RemapSettings | None = None) -> dict[str, Any]:
    """The flat ``QGPMConfig`` keywords of these groups; a group left out takes its defaults."""
    out: dict[str, Any] = {}
    for arg, value, kinds in (("pass1", pass1, (Pass1Settings,)), ("shaping", shaping, (ShapingSettings,)),
                              ("confidence", confidence, (ConfidenceRules,)), ("remap", remap, tuple(REMAPS.values()))):
        if value is None:
            value = kinds[0]()
        if not isinstance(value, kinds):
            hint = f"; for remap={value!r} write remap={REMAPS[value].__name__}()" if isinstance(value, str) and value in REMAPS else ""
            names = [k.__name__ for k in kinds]
            expected = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
            raise TypeError(f"{arg} must be {expected}, got {type(value).__name__} {value!r}{hint}")
        out.update({name: getattr(value, name) for name in _names(type(value))})
    out["remap"] = remap.REMAP if remap is not None else StrideRemap.REMAP
    return out
