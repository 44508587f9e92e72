"""How an answer is decoded: the decoding arguments as one checked object, and the text rules.

:class:`Decoding` carries ``max_new_tokens``, ``temperature``, ``top_p``, ``stop`` and
``seed`` (plus any other ``generate()`` keyword arguments for the transformers generator),
checked once when it is built, before any model work. Every generator (transformers here,
a vLLM server in :mod:`qgpm.serving`) reads the same object, and the answer text is finished
by the same rules (:func:`finish_text`).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from transformers import GenerationConfig, LogitsProcessorList, MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from .defaults import ANSWER_ARGUMENTS
from .field_checks import closest_name
from .log import warn_once

__all__ = ["Decoding", "DECODING_FIELDS", "check_extra_values", "check_generate_extras", "check_stop", "cut_at_stop", "finish_text", "SeededSampler"]

DECODING_FIELDS = ("max_new_tokens", "temperature", "top_p", "stop", "seed")
"""The decoding arguments every generator understands (the rest are ``generate()`` extras)."""


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
        check_extra_values(extra, int(max_new_tokens))
        if temperature == 0:
            unused = [n for n, v in (("top_p", top_p if top_p != 1 else None), ("seed", seed), ("top_k", extra.get("top_k")),
                                     ("min_p", extra.get("min_p"))) if v is not None]
            if unused:
                verb = "has" if len(unused) == 1 else "have"
                warn_once(f"qgpm: temperature=0 decodes greedily, so {', '.join(unused)} {verb} no effect; set temperature > 0 to sample with them")
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
    """``stop`` as a tuple of non-empty strings: ``None``, one string or a list of strings (empty
    strings are dropped: they stop nothing); anything else raises ``TypeError``."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, (bytes, Mapping)) or not hasattr(stop, "__iter__"):
        raise TypeError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
    stops = list(stop)
    bad = [type(x).__name__ for x in stops if not isinstance(x, str)]
    if bad:
        raise TypeError(f"stop must be a string or a list of strings; it holds {', '.join(sorted(set(bad)))}")
    return tuple(x for x in stops if x)  # an empty string stops nothing (a LangChain or OpenAI caller's "no stop")


# ----------------------------------------------------------------------------- generate() extras

# generate() arguments qgpm sets itself for every call
_GENERATE_OWN = frozenset({"input_ids", "attention_mask", "streamer", "tokenizer", "stop_strings", "do_sample", "max_length"})
# sampling settings SeededSampler does not apply (generate() itself decodes greedily, so they would do nothing)
_SAMPLING_NOT_APPLIED = frozenset({"typical_p", "epsilon_cutoff", "eta_cutoff", "top_h"})
# settings for other decoding strategies (several sequences, beams, contrastive / DoLa / assisted decoding) and for
# outputs other than one sequence of token ids: qgpm decodes one sequence, token by token, under its position plan
_OTHER_DECODING = frozenset({
    "num_beams", "num_beam_groups", "diversity_penalty", "length_penalty", "early_stopping", "num_return_sequences", "constraints",
    "force_words_ids", "penalty_alpha", "dola_layers", "assistant_model", "assistant_early_exit", "prompt_lookup_num_tokens",
    "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold", "assistant_lookbehind",
    "target_lookbehind", "max_matching_ngram_size", "speculation_type", "use_mtp", "return_dict_in_generate", "output_scores",
    "output_logits", "output_attentions", "output_hidden_states", "synced_gpus", "generation_config", "custom_generate",
    "continuous_batching_config", "low_memory", "use_cache",
})
# generate() keyword arguments that are no GenerationConfig field
_GENERATE_ARGS = frozenset({"logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "negative_prompt_ids",
                            "negative_prompt_attention_mask"})


@functools.cache
def _generate_settings() -> frozenset[str]:
    """The names ``generate()`` takes as settings: ``GenerationConfig``'s fields and its own arguments."""
    return frozenset(set(GenerationConfig().to_dict()) - {"_from_model_config", "transformers_version"}) | _GENERATE_ARGS


def check_generate_extras(extra: Any) -> None:
    """Raise, before any model work, for a ``generate()`` extra the transformers generator would
    not apply: one that is neither a ``GenerationConfig`` field nor a ``generate()`` argument, one
    qgpm sets itself, a sampling setting its sampler does not apply, or a setting of another
    decoding strategy (beams, several sequences, assisted decoding)."""
    if not extra:  # most calls: nothing to check
        return
    own = sorted(set(extra) & _GENERATE_OWN)
    if own:
        raise ValueError(f"{', '.join(own)}: set by qgpm itself for every call (sampling: temperature > 0; stop strings: stop=; "
                         "the length: max_new_tokens=)")
    unapplied = sorted(set(extra) & _SAMPLING_NOT_APPLIED)
    if unapplied:
        raise ValueError(f"{', '.join(unapplied)}: qgpm samples with temperature, top_p, top_k and min_p only; drop {', '.join(unapplied)}")
    other = sorted(set(extra) & _OTHER_DECODING)
    if other:
        raise ValueError(f"{', '.join(other)}: not supported; qgpm decodes one sequence per call, token by token under its "
                         "position plan (greedy, or sampled with temperature > 0)")
    unknown = sorted(set(extra) - _generate_settings())
    if unknown:
        raise TypeError(f"unexpected arguments {unknown}: neither answer() arguments nor transformers generate() settings "
                        "(GenerationConfig fields such as repetition_penalty, min_new_tokens, top_k, or logits_processor)"
                        + did_you_mean(unknown, [*ANSWER_ARGUMENTS, *_generate_settings()]))


def did_you_mean(names: Sequence[str], known: Sequence[str] = ANSWER_ARGUMENTS) -> str:
    """``". Did you mean 'x'?"`` naming the closest of ``known`` to each misspelt name (``'x' for 'y'``
    with several), or ``""``."""
    close = {name: m for name in names if (m := closest_name(name, known)) is not None}
    if not close:
        return ""
    if len(close) == 1:
        return f". Did you mean {next(iter(close.values()))!r}?"
    return ". Did you mean " + ", ".join(f"{m!r} for {name!r}" for name, m in close.items()) + "?"


def _whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _token_ids(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        value = value.tolist() if not value.is_floating_point() and not value.is_complex() else [0.5]
    ids = [value] if _whole(value) else value
    return not isinstance(ids, (str, bytes)) and hasattr(ids, "__iter__") and all(_whole(i) and i >= 0 for i in ids)


def _callables(value: Any) -> bool:
    return not isinstance(value, (str, bytes)) and hasattr(value, "__iter__") and all(callable(x) for x in value)


# generate() extras whose values qgpm can check without a model: (well-typed, in range, what is expected)
_EXTRA_VALUES: dict[str, tuple[Callable[[Any], bool], Callable[[Any], bool], str]] = {
    "top_k": (_whole, lambda v: v >= -1, "an int >= 0 (0 or -1: no top-k cut)"),
    "min_p": (_real, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "repetition_penalty": (_real, lambda v: v > 0, "a number > 0 (1.0: no penalty)"),
    "no_repeat_ngram_size": (_whole, lambda v: v >= 0, "an int >= 0"),
    "min_new_tokens": (_whole, lambda v: v >= 0, "an int >= 0"),
    "max_time": (_real, lambda v: v > 0, "a number of seconds > 0"),
    "eos_token_id": (_token_ids, lambda v: True, "a token id (an int >= 0) or a list of them"),
    "pad_token_id": (_token_ids, lambda v: True, "a token id (an int >= 0) or a list of them"),
    "logits_processor": (_callables, lambda v: True, "a list of callables (transformers' LogitsProcessor objects)"),
    "stopping_criteria": (_callables, lambda v: True, "a list of callables (transformers' StoppingCriteria objects)"),
}


def check_extra_values(extra: Mapping[str, Any], max_new_tokens: int | None = None) -> None:
    """Raise ``TypeError`` / ``ValueError`` for a ``generate()`` extra whose value cannot work
    (the settings of ``_EXTRA_VALUES``, and ``min_new_tokens`` above ``max_new_tokens``; ``None``
    leaves a setting unset). Names are checked by the generator (:func:`check_generate_extras`)."""
    for name, value in extra.items():
        rule = _EXTRA_VALUES.get(name)
        if rule is None or value is None:
            continue
        typed, in_range, what = rule
        if not typed(value):
            wrong_type = not _real(value) or isinstance(value, bool) or typed in (_token_ids, _callables)
            raise (TypeError if wrong_type else ValueError)(f"{name} must be {what}, got {type(value).__name__} {value!r}")
        if not in_range(value):
            raise ValueError(f"{name} must be {what}, got {value!r}")
    low = extra.get("min_new_tokens")
    if max_new_tokens is not None and low is not None and low > max_new_tokens:
        raise ValueError(f"min_new_tokens={low} exceeds max_new_tokens={max_new_tokens}")


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the first stop string, and whether one was found."""
    hits = [text.index(s) for s in stop if s and s in text]
    return (text[: min(hits)], True) if hits else (text, False)


def finish_text(text: str, n_new: int, decoding: Decoding, eos: bool | None = None) -> tuple[str, str]:
    """The answer from the decoded new text: cut at the first stop string and stripped, with its
    finish reason (``"stop"``: a stop string or the end of sequence; ``"length"``: the budget,
    ``max_new_tokens``, or the ``max_time`` extra when the answer did not end with an
    end-of-sequence token, ``eos`` False)."""
    out_of_time = decoding.extra.get("max_time") is not None and eos is False
    reason = "length" if n_new >= decoding.max_new_tokens or out_of_time else "stop"
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
        if top_k and top_k > 0:
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
