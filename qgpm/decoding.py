"""How an answer is decoded: the decoding arguments as one checked object, and the text rules.

:class:`Decoding` carries ``max_new_tokens``, ``temperature``, ``top_p``, ``stop`` and
``seed`` (plus any other ``generate()`` keyword arguments for the transformers generator),
checked once when it is built, before any model work. Every generator (transformers here,
a vLLM server in :mod:`qgpm.serving`) reads the same object, and the answer text is finished
by the same rules (:func:`finish_text`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from transformers import LogitsProcessorList, MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

__all__ = ["Decoding", "DECODING_FIELDS", "check_extra_values", "check_stop", "cut_at_stop", "finish_text", "SeededSampler"]

DECODING_FIELDS = ("max_new_tokens", "temperature", "top_p", "stop", "seed")
"""The decoding arguments every generator understands (the rest are ``generate()`` extras)."""


def _whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


# generate() extras whose values qgpm can check without a model: (well-typed, in range, what is expected)
_EXTRA_VALUES: dict[str, tuple[Any, Any, str]] = {
    "top_k": (_whole, lambda v: v >= 0, "an int >= 0 (0: no top-k cut)"),
    "min_p": (_real, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "repetition_penalty": (_real, lambda v: v > 0, "a number > 0 (1.0: no penalty)"),
    "no_repeat_ngram_size": (_whole, lambda v: v >= 0, "an int >= 0"),
    "min_new_tokens": (_whole, lambda v: v >= 0, "an int >= 0"),
}


def check_extra_values(extra: Mapping[str, Any]) -> None:
    """Raise ``TypeError`` / ``ValueError`` for a ``generate()`` extra whose value cannot work
    (``top_k``, ``min_p``, ``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``;
    ``None`` leaves a setting unset). Names are checked by the generator."""
    for name, value in extra.items():
        rule = _EXTRA_VALUES.get(name)
        if rule is None or value is None:
            continue
        typed, in_range, what = rule
        if not typed(value):
            wrong_type = isinstance(value, bool) or not isinstance(value, numbers.Real)
            raise (TypeError if wrong_type else ValueError)(f"{name} must be {what}, got {type(value).__name__} {value!r}")
        if not in_range(value):
            raise ValueError(f"{name} must be {what}, got {value!r}")


@dataclass(frozen=True)
class Decoding:
    """The decoding arguments of one call, checked (build it with :meth:`check` or :meth:`take`).

    ``max_new_tokens``: at most this many new tokens; ``temperature``: 0 = greedy decoding;
    ``top_p``: nucleus sampling; ``stop``: strings that end the answer (cut from it);
    ``seed``: makes sampling reproducible with a generator local to the call; ``extra``:
    other keyword arguments for transformers' ``generate()`` (``top_k``, ``min_p``,
    ``logits_processor``, ...).
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def check(cls, max_new_tokens: Any = 64, temperature: Any = 0.0, top_p: Any = 1.0, stop: Any = None, seed: Any = None,
              **extra: Any) -> "Decoding":
        """The checked arguments; bad ones raise ``TypeError`` / ``ValueError`` saying which."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral):
            raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__} {max_new_tokens!r}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        for name, value in (("temperature", temperature), ("top_p", top_p)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy decoding), got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
                raise TypeError(f"seed must be an int or None, got {type(seed).__name__} {seed!r}")
            if not 0 <= seed < 2**64:
                raise ValueError(f"seed must be in [0, 2**64), got {seed}")
        check_extra_values(extra)
        return cls(int(max_new_tokens), temperature, top_p, check_stop(stop), seed, dict(extra))

    @classmethod
    def take(cls, kwargs: dict[str, Any], **defaults: Any) -> "Decoding":
        """Check the decoding arguments in ``kwargs`` (``defaults`` for those it lacks); every
        other key is a ``generate()`` extra. ``kwargs`` is emptied."""
        values = {**defaults, **kwargs}
        kwargs.clear()
        return cls.check(**values)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_stop(stop: Any) -> tuple[str, ...]:
    """``stop`` as a tuple of non-empty strings: ``None``, one string or a list of strings;
    anything else raises ``TypeError``."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if isinstance(stop, (bytes, Mapping)) or not hasattr(stop, "__iter__"):
        raise TypeError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
    stops = list(stop)
    bad = [type(x).__name__ for x in stops if not isinstance(x, str)]
    if bad:
        raise TypeError(f"stop must be a string or a list of strings; it holds {', '.join(sorted(set(bad)))}")
    return tuple(x for x in stops if x)


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the first stop string, and whether one was found."""
    hits = [text.index(s) for s in stop if s and s in text]
    return (text[: min(hits)], True) if hits else (text, False)


def finish_text(text: str, n_new: int, decoding: Decoding) -> tuple[str, str]:
    """The answer from the decoded new text: cut at the first stop string and stripped, with its
    finish reason (``"stop"``: a stop string or the end of sequence; ``"length"``: the budget)."""
    reason = "length" if n_new >= decoding.max_new_tokens else "stop"
    text, hit = cut_at_stop(text, decoding.stop)
    return text.strip(), "stop" if hit else reason


class SeededSampler:
    """A logits processor that draws the next token with a generator local to the call.

    ``generate()`` runs greedily with this processor last: it applies the sampling
    warpers (temperature, top-k, top-p, min-p; the ``transformers`` classes), draws one
    token per row with its own ``torch.Generator`` and leaves only that token
    selectable. The generator is created and seeded on the first step, inside the
    model lock; ``seed=None`` seeds it at random. No global RNG is read or changed, so
    concurrent sampling calls with a seed are reproducible.
    """

    def __init__(self, temperature: float, top_p: float, seed: int | None, *, top_k: int | None = None, min_p: float | None = None) -> None:
        warpers: list[Any] = []
        if temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(float(temperature)))
        if top_k:
            warpers.append(TopKLogitsWarper(int(top_k)))
        if top_p < 1.0:
            warpers.append(TopPLogitsWarper(float(top_p)))
        if min_p is not None:
            warpers.append(MinPLogitsWarper(float(min_p)))
        self.warpers = LogitsProcessorList(warpers)
        self.seed = seed
        self.generator: torch.Generator | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.generator is None:
            self.generator = torch.Generator(device=scores.device)
            if self.seed is None:
                self.generator.seed()
            else:
                self.generator.manual_seed(int(self.seed))
        warped = self.warpers(input_ids, scores)
        probs = torch.softmax(warped.float(), dim=-1)
        drawn = torch.multinomial(probs, num_samples=1, generator=self.generator)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, drawn, 0.0)
