"""Settings of the query-agnostic RoPE baselines: one frozen, validated object per method.

    from qgpm import QGPM, StringOptions
    engine.answer(context, question, method="string", options=StringOptions(local_window=256))

Every field is checked when the object is built, so a bad setting fails before any model
work. ``to_dict()`` is what the evaluation harness hashes into a row's ``config_hash``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar

__all__ = ["StringOptions", "MsPoEOptions", "SelfExtendOptions", "LLMLingua2Options", "STRING_RELEASED_SCALE", "LLMLINGUA2_MODEL_KINDS"]

STRING_RELEASED_SCALE: float = 0.1 * math.log(2) + 1
"""The extra factor (~1.0693) the released STRING code multiplies its cos/sin tables by
("similar with YaRN": ``0.1 ln 2 + 1``). It is not part of the method in the STRING paper;
pass ``StringOptions(cos_sin_scale=STRING_RELEASED_SCALE)`` to reproduce the released code."""


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    return float(value)


class _Options:
    """Shared helpers of the option classes (``method`` names the method they belong to)."""

    method: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    def with_(self, **changes: Any):
        """A copy with some fields changed (validated)."""
        return replace(self, **changes)  # type: ignore[type-var]

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))  # type: ignore[arg-type]


@dataclass(frozen=True)
class StringOptions(_Options):
    """STRING (An et al., 2025): shift long relative distances onto well-trained ones.

    A relative distance ``d`` stays ``d`` below ``S`` and becomes ``d - S + W`` at or
    beyond ``S`` (:func:`qgpm.baselines.rules.string_distance`).

    Attributes
    ----------
    shift:
        ``S`` in tokens; ``None`` = ``floor(shift_ratio * N)`` with ``N`` the prompt length.
    shift_ratio:
        ``S / N`` when ``shift`` is None (paper and released code: 1/3, i.e. 0.33 L).
    local_window:
        ``W``: the distance a token at distance ``S`` is moved to (paper: 128). Must not
        exceed ``S``: at ``W > S`` the rule would push distances further, not nearer.
    cos_sin_scale:
        Factor on the rotated query and key (logits scale by its square), 1.0 by default.
        The released code uses :data:`STRING_RELEASED_SCALE` (~1.069) on every position;
        the STRING paper does not have it, it changes every logit (also those STRING
        keeps at their distance), and with it STRING no longer equals vanilla when no
        distance reaches ``S``. So the default follows the paper; set the released value
        to reproduce the released code.
    """

    method: ClassVar[str] = "string"
    shift: int | None = None
    shift_ratio: float = 1.0 / 3.0
    local_window: int = 128
    cos_sin_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.shift is not None:
            _check_int("StringOptions.shift", self.shift, 1)
        ratio = _check_float("StringOptions.shift_ratio", self.shift_ratio)
        if not 0 < ratio <= 1:
            raise ValueError(f"StringOptions.shift_ratio must be in (0, 1], got {self.shift_ratio}")
        _check_int("StringOptions.local_window", self.local_window, 0)
        if self.shift is not None and self.local_window > self.shift:
            raise ValueError(
                f"StringOptions.local_window (W={self.local_window}) exceeds shift (S={self.shift}): distances "
                "d >= S would become d - S + W > d. Use a smaller local_window or a larger shift."
            )
        scale = _check_float("StringOptions.cos_sin_scale", self.cos_sin_scale)
        if scale <= 0:
            raise ValueError(f"StringOptions.cos_sin_scale must be positive, got {self.cos_sin_scale}")

    def shift_for(self, n_tokens: int) -> int:
        """``S`` for a prompt of ``n_tokens`` tokens."""
        return self.shift if self.shift is not None else int(self.shift_ratio * n_tokens)


@dataclass(frozen=True)
class MsPoEOptions(_Options):
    """Ms-PoE (Zhang et al., 2024): per-head position scaling ("multi-scale positions").

    Head ``h`` reads positions ``p / r_h``. The ratios run from ``min_ratio`` to
    ``max_ratio`` over the heads ordered by an outlier-based position-awareness score
    (:func:`qgpm.baselines.rules.position_awareness_scores`), computed once per call from
    the prompt's last row. Under grouped-query attention each KV group gets one ratio
    (its query heads and its key share it). The first ``skip_layers`` layers keep
    standard positions.

    Attributes
    ----------
    min_ratio, max_ratio:
        Ratio range (paper and released scripts: 1.2 to 1.8). ``1.0, 1.0`` = vanilla.
    skip_layers:
        Layers at the bottom that keep standard positions (released scripts: 2).
    """

    method: ClassVar[str] = "ms-poe"
    min_ratio: float = 1.2
    max_ratio: float = 1.8
    skip_layers: int = 2

    def __post_init__(self) -> None:
        lo = _check_float("MsPoEOptions.min_ratio", self.min_ratio)
        hi = _check_float("MsPoEOptions.max_ratio", self.max_ratio)
        if not 1 <= lo <= hi:
            raise ValueError(
                f"MsPoEOptions needs 1 <= min_ratio <= max_ratio (ratios compress positions), got "
                f"min_ratio={self.min_ratio}, max_ratio={self.max_ratio}"
            )
        _check_int("MsPoEOptions.skip_layers", self.skip_layers, 0)


@dataclass(frozen=True)
class SelfExtendOptions(_Options):
    """Self-Extend (Jin et al., 2024): a neighbour window plus grouped positions beyond it.

    Query ``i`` and key ``j`` at distance ``i - j < window`` keep their positions; farther
    pairs use ``floor(i / G) + W - W / G`` for the query and ``floor(j / G)`` for the key
    (:func:`qgpm.baselines.rules.self_extend_positions`).

    Attributes
    ----------
    group_size:
        ``G`` (released defaults 8; the README's range is 2 to 64). ``1`` = vanilla.
    window:
        ``W``, the neighbour window in tokens (default 1024; README range 512 to 1536).
    """

    method: ClassVar[str] = "self-extend"
    group_size: int = 8
    window: int = 1024

    def __post_init__(self) -> None:
        _check_int("SelfExtendOptions.group_size", self.group_size, 1)
        _check_int("SelfExtendOptions.window", self.window, 1)


LLMLINGUA2_MODEL_KINDS: tuple[str, ...] = ("xlm-roberta-large", "bert-base-multilingual-cased")
"""llmlingua picks its word-boundary rule from the compressor's name: the path must contain one of these."""


@dataclass(frozen=True)
class LLMLingua2Options(_Options):
    """LLMLingua-2 (Pan et al., 2024): a token classifier keeps the words it scores as
    informative; the model then answers over the compressed context with standard RoPE.

    Runs with the ``llmlingua`` package and compressor weights you supply (no download at
    run time), e.g. a local copy of ``microsoft/llmlingua-2-xlm-roberta-large-meetingbank``.

    Attributes
    ----------
    model:
        Local folder (or cached hub id) of the compressor. llmlingua chooses how to join
        sub-words from the name, so it must contain ``xlm-roberta-large`` or
        ``bert-base-multilingual-cased`` (keep the released folder names).
    rate:
        Share of tokens to keep (LLMLingua-2's examples: 0.33).
    force_tokens:
        Tokens always kept (LLMLingua-2's examples: newline and ``?``).
    device:
        Where the compressor runs (``"cpu"``, ``"cuda"``).
    """

    method: ClassVar[str] = "llmlingua-2"
    model: str = ""
    rate: float = 0.33
    force_tokens: tuple[str, ...] = ("\n", "?")
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(
                "LLMLingua2Options.model is required: the path of the compressor weights, e.g. a local copy of "
                "microsoft/llmlingua-2-xlm-roberta-large-meetingbank"
            )
        if not any(kind in self.model for kind in LLMLINGUA2_MODEL_KINDS):
            raise ValueError(
                f"LLMLingua2Options.model={self.model!r}: llmlingua reads the compressor kind from its name, which must "
                f"contain one of {', '.join(LLMLINGUA2_MODEL_KINDS)} (keep the released folder name)"
            )
        rate = _check_float("LLMLingua2Options.rate", self.rate)
        if not 0 < rate <= 1:
            raise ValueError(f"LLMLingua2Options.rate must be in (0, 1], got {self.rate}")
        tokens = tuple(self.force_tokens) if isinstance(self.force_tokens, (list, tuple)) else None
        if tokens is None or not all(isinstance(t, str) and t for t in tokens):
            raise TypeError(f"LLMLingua2Options.force_tokens must be a sequence of non-empty strings, got {self.force_tokens!r}")
        object.__setattr__(self, "force_tokens", tokens)
        if not isinstance(self.device, str) or not self.device:
            raise TypeError(f"LLMLingua2Options.device must be a device name such as 'cpu', got {self.device!r}")
