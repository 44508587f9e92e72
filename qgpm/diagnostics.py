"""What a call decided and how it ran: :class:`Diagnostics`, typed, one field per fact.

``PreparedCall.details`` and ``QGPMResult.details`` are a :class:`Diagnostics`. The CLI, the
explanation page, the eval rows and the adapters read its fields (``result.details.s_low``);
it is also a mapping of the facts a call has (``dict(result.details)``,
``result.details.get("s_low")``), which is what the adapters' metadata and JSON output hold.
A field that a call did not set is ``None`` and is not a key of the mapping.

Two open parts, both plain dicts: ``settings``, a query-agnostic baseline's settings for the
prompt (STRING's shift and window, ...), and ``extra``, what a framework adapter records about
the call (a key that is not a field lands there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from .field_checks import closest_name

__all__ = ["Diagnostics", "FIELDS"]


@dataclass(eq=False)
class Diagnostics(MutableMapping):
    """The facts of one call (see the module docstring); every field ``None`` until set."""

    # the plan (qgpm, oracle)
    boundary_plane: float | None = None  # the frequency gate's first modulated rotary plane
    anchor_length: float | None = None  # the gate's wavelength in tokens
    s_low: float | None = None  # the low score of the plan (1.0: vanilla positions kept, by any rule)
    flat_relevance: bool | None = None  # the top z was below min_top_z (or every z tied): vanilla positions kept
    tied_relevance: bool | None = None  # no sentence ranked above another (every z the same, or one sentence): flat
    min_top_z: float | None = None  # the flat-relevance threshold this call applied ("calibrated" resolved); None: the rule was off
    decisive_relevance: bool | None = None  # one sentence stood out by decisive_margin: vanilla positions kept
    solo_relevance: bool | None = None  # the top sentence stood out by solo_margin: promoted alone
    term_dropped: int | None = None  # top-ranked sentences the query-term filter did not promote
    promoted: int | None = None  # sentences the plan acted on (moved, or kept a full step under stride)
    kept_reason: str | None = None  # why nothing was promoted (qgpm.plan.KEPT_REASONS); None when something was
    # where the relevance came from (qgpm)
    relevance_source: str | None = None  # a reranker source ("minilm", "heads+bm25"); None: the heads
    heads: int | None = None  # heads pass 1 read
    layers_run: int | None = None  # decoder layers pass 1 ran
    pass1_continued: bool | None = None  # pass 1 went on as the prefill generation starts from
    pass1_dtype: str | None = None  # pass 1's dtype where it was not the model's
    # an edit of the context (llmlingua-2)
    original_tokens: int | None = None
    compressed_tokens: int | None = None
    # generation
    pass2: str | None = None  # "standard", "slot order", "masks" or "positions"
    prefill_reused: int | None = None  # prompt tokens generation took from pass 1's prefill
    prefill_continued_s: float | None = None  # seconds of prefill run at the end of pass 1
    generator: str | None = None  # where pass 2 ran when not in this process ("vllm")
    # score= (the teacher-forced log-probability of a continuation)
    score_logprob: float | None = None
    score_tokens: int | None = None
    score_s: float | None = None
    # a plain-chat reply without context (the adapters' no-context policy)
    empty_context: bool | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # a baseline's settings for this prompt
    extra: dict[str, Any] = field(default_factory=dict)  # what a framework adapter records

    @classmethod
    def of(cls, values: "Mapping[str, Any] | Diagnostics | None") -> "Diagnostics":
        """``values`` as a :class:`Diagnostics` (a copy of one, or the facts of a mapping)."""
        if isinstance(values, Diagnostics):
            return values.copy()
        out = cls()
        if values is not None:
            if not isinstance(values, Mapping):
                raise TypeError(f"details must be a mapping of facts or a Diagnostics, got {type(values).__name__}")
            out.update(values)
        return out

    def copy(self) -> "Diagnostics":
        """An independent copy (its own ``settings`` and ``extra``)."""
        return dataclasses.replace(self, settings=dict(self.settings), extra=dict(self.extra))

    def __getattr__(self, name: str) -> Any:  # only reached for a name that is not a field
        if name.startswith("_") or name in ("settings", "extra"):
            raise AttributeError(name)
        where = "a baseline's setting" if name in self.__dict__.get("settings", {}) else \
            "an adapter's record" if name in self.__dict__.get("extra", {}) else None
        if where:
            raise AttributeError(f"{name!r} is {where}, not a named fact: read it with details.get({name!r}) or details[{name!r}]")
        close = closest_name(name, FIELDS)
        hint = f"did you mean {close!r}? " if close else ""
        raise AttributeError(f"Diagnostics has no fact {name!r}: {hint}the named facts are qgpm.diagnostics.FIELDS (None where a call "
                             "did not set them); a baseline's settings and an adapter's records are keys, read with details.get(key)")

    # ------------------------------------------------------------------ the mapping of set facts
    def __getitem__(self, key: str) -> Any:
        if key in FIELDS:
            value = getattr(self, key)
            if value is None:
                raise KeyError(key)
            return value
        if key in self.settings:
            return self.settings[key]
        return self.extra[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key in FIELDS:
            setattr(self, key, value)
        elif key in self.settings:
            self.settings[key] = value
        else:
            self.extra[key] = value

    def __delitem__(self, key: str) -> None:
        if key in FIELDS:
            if getattr(self, key) is None:
                raise KeyError(key)
            setattr(self, key, None)
        elif key in self.settings:
            del self.settings[key]
        else:
            del self.extra[key]

    def __iter__(self) -> Iterator[str]:
        yield from (f for f in FIELDS if getattr(self, f) is not None)
        yield from self.settings
        yield from (k for k in self.extra if k not in self.settings)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"Diagnostics({dict(self.items())!r})"


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Diagnostics) if f.name not in ("settings", "extra"))
"""The named facts of :class:`Diagnostics`, in order."""
