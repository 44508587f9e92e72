"""What a QGPM call returns: the answer, its explanation, usage and timings.

:class:`QGPMResult` (from :meth:`QGPM.answer <qgpm.QGPM.answer>`, ``chat``,
``generate_prepared``) holds the answer with one :class:`SentenceRelevance` per context
sentence, its :class:`Usage` and :class:`Timings`. :class:`PreparedCall` is everything
decided before generation (:meth:`QGPM.prepare <qgpm.QGPM.prepare>`), and
:class:`AnswerStream` yields an answer piece by piece (:meth:`QGPM.stream <qgpm.QGPM.stream>`).
Plain data: nothing here runs a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from .config import QGPMConfig
from .diagnostics import Diagnostics
from .explain import best_chunks, check_count, clip, decision_note, no_ranking_note, plot_relevance, promoted_label, ranked_by, render_html, sentence_depth, term_note
from .prompt import Prompt

__all__ = ["SentenceRelevance", "Usage", "Timings", "QGPMResult", "PreparedCall", "StreamState", "AnswerStream"]


@dataclass
class SentenceRelevance:
    """One context sentence with what QGPM made of it.

    ``start``/``end`` are char offsets into the context string (documents joined by the
    separator); ``z`` is the fused head relevance (None for Oracle); ``rank`` 0 = most
    relevant; ``broad``/``sharp`` are the sentence's scores in the two maps (1 = unit
    stride, ``s_low`` = most compressed on fast planes; text before the first relevant
    sentence also scores 1, kept in place). ``promoted``: the plan acted on the sentence as
    relevant (moved under ``remap="reorder"`` / ``"move"``, kept a full step while others were
    compressed under ``"stride"``; for the Oracle, the sentence holds evidence, and only the
    evidence text moved, not the rest of the sentence); ``moved_to``: where a moved sentence went, ``"question"``
    (next to the question) or ``"start"`` (the context's start, every second one under
    ``placement="ends"``), ``None`` where nothing moved it; ``term_dropped``: it was among the
    top ranked but the query-term filter (``term_ratio``) left it in place. ``text`` is the
    sentence without the whitespace around it and ``context[start:end] == text``.
    """

    index: int
    text: str
    start: int
    end: int
    doc: int
    rank: int
    broad: float
    sharp: float
    z: float | None = None
    promoted: bool = False
    term_dropped: bool = False
    moved_to: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (for JSON)."""
        return dict(self.__dict__)


@dataclass
class Usage:
    """Token counts of one call: the prompt as the model saw it and the generated answer."""

    prompt_tokens: int = 0
    answer_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """``prompt_tokens + answer_tokens``."""
        return self.prompt_tokens + self.answer_tokens


@dataclass
class Timings:
    """Seconds spent in each phase; ``first_token_s`` = time to first token (edit + pass 1 + plan + prefill)."""

    edit_s: float = 0.0
    pass1_s: float = 0.0
    plan_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0

    @property
    def first_token_s(self) -> float:
        """Time to first token: ``edit_s + pass1_s + plan_s + prefill_s``."""
        return self.edit_s + self.pass1_s + self.plan_s + self.prefill_s


@dataclass
class QGPMResult:
    """The answer and why it came out so.

    ``relevance``: one :class:`SentenceRelevance` per context sentence (empty for methods
    without a ranking); ``finish_reason``: ``"stop"`` or ``"length"``; ``edit``: the
    Top-K / Reorder / LLMLingua-2 edit of the context, if any; ``details``: the call's facts
    as a typed :class:`~qgpm.diagnostics.Diagnostics` (``result.details.s_low``,
    ``result.details.flat_relevance``, ``result.details.score_logprob``, ...; also a mapping of
    the facts set); ``config``: the :class:`~qgpm.QGPMConfig` a ``qgpm`` / ``oracle`` call planned
    with (``result.config.provenance`` says which: a model's preset, the generic recipe, a tuned
    config), ``None`` for the other methods. A result owns its ``timings`` and ``details``: they
    are not shared with the :class:`PreparedCall`.
    """

    text: str
    method: str
    relevance: list[SentenceRelevance] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)
    finish_reason: str = "stop"
    edit: Any = None  # EditedContext for topk / reorder
    details: Diagnostics = field(default_factory=Diagnostics)
    context: str | None = None  # the context as the prompt held it (relevance spans index into it)
    question: str | None = None
    config: QGPMConfig | None = None  # the settings a qgpm / oracle call planned with (its .provenance: which); None otherwise

    def __post_init__(self) -> None:
        if not isinstance(self.details, Diagnostics):
            self.details = Diagnostics.of(self.details)

    def to_html(self, *, top: int = 10) -> str:
        """A self-contained HTML page showing why this answer came out (:func:`qgpm.explain.render_html`);
        ``top``: how many best-ranked sentences (or Top-K / Reorder chunks) it lists."""
        return render_html(self, top=top)

    def plot(self, *, evidence: Sequence[str] | None = None, ax: Any = None):
        """A matplotlib figure of sentence relevance against position in the context."""
        return plot_relevance(self, evidence=evidence, ax=ax)

    def top_sentences(self, k: int = 5) -> list[SentenceRelevance]:
        """The ``k`` sentences ranked most relevant (best first)."""
        return sorted(self.relevance, key=lambda s: s.rank)[: check_count(k, "k")]

    def explain(self, k: int = 5) -> str:
        """A short human-readable account of the ranking: the ``k`` best-ranked sentences (0: the
        header and notes only) and why positions were kept where a rule kept them."""
        check_count(k, "k")
        if not self.relevance:  # Top-K / Reorder: the chunks the reranker scored best
            return "\n".join([f"method={self.method}: {no_ranking_note(self)}"] + [f"  {line}" for line in best_chunks(self, k)])
        by = ranked_by(self)
        ranked = f", {by}" if by else ""
        top = self.top_sentences(k)
        lines = [f"method={self.method}: top {len(top)} of {len(self.relevance)} sentences{ranked}"]
        for s in top:
            z = "" if s.z is None else f" z={s.z:+.2f}"
            did = promoted_label(s.promoted, s.moved_to, lead=" ") if s.promoted else " (term filter: left in place)" if s.term_dropped else ""
            depth = f" depth={100 * sentence_depth(s, self.context):.0f}%"  # tells repeated sentences apart
            lines.append(f"  #{s.rank + 1}{z} broad={s.broad:.2f} sharp={s.sharp:.2f}{depth}{did}  {clip(s.text, 120)}")
        best = min(self.relevance, key=lambda s: s.rank)
        notes = [decision_note(self.details, self.method, top_z=best.z), term_note(self.details.term_dropped) if self.details.term_dropped else None]
        lines += [f"  ({n})" for n in notes if n]
        return "\n".join(lines)


@dataclass
class PreparedCall:
    """Everything decided before generation (what :meth:`QGPM.prepare <qgpm.QGPM.prepare>` returns).

    ``prompt``: the tokenized prompt with its role spans and sentences; ``plan``: the
    position plan (``None`` = standard RoPE: vanilla, topk, reorder; an attention-level
    :class:`~qgpm.baselines.BaselinePlan` for string, ms-poe, self-extend); ``relevance``: the
    per-sentence ranks and map scores; ``edit``: the Top-K / Reorder edit, if any;
    ``z``: QGPM's fused head relevance per sentence (qgpm only), kept so that
    :meth:`QGPM.replan <qgpm.QGPM.replan>` can try other shaping settings without rerunning
    pass 1; ``config``: the settings the plan was built with. Run it with
    :meth:`QGPM.generate_prepared <qgpm.QGPM.generate_prepared>` (as often as you like:
    generation leaves the call unchanged); ``prefill``: the vanilla KV states pass 1
    computed when it went on as a prefill (``QGPM.reuse_prefill``), which generation starts
    from (held as long as the call is).
    """

    prompt: Prompt | None
    method: str
    plan: Any
    relevance: list[SentenceRelevance]
    timings: Timings
    edit: Any
    details: Diagnostics
    input_ids: torch.Tensor | None = None
    z: torch.Tensor | None = None
    config: QGPMConfig | None = None
    units: Any = None
    prefill: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.details, Diagnostics):
            self.details = Diagnostics.of(self.details)
        if self.input_ids is None:
            self.input_ids = self.prompt.input_ids

    @property
    def num_tokens(self) -> int:
        """The number of prompt tokens the model reads."""
        return int(self.input_ids.shape[1])


class StreamState:
    """What an :class:`AnswerStream` shares with the generator behind it (no reference back to the stream)."""

    __slots__ = ("result", "closed", "_cancel")

    def __init__(self) -> None:
        self.result: QGPMResult | None = None
        self.closed = False  # set by AnswerStream.close(), from any thread
        self._cancel: Callable[[], None] | None = None

    def cancel_with(self, cancel: Callable[[], None]) -> None:
        """Register how to stop the generation now running (its ``cancel``); a stream already
        closed stops it at once."""
        self._cancel = cancel
        if self.closed:
            cancel()

    def close(self) -> None:
        """Mark the stream closed and stop its generation at the next decoding step."""
        self.closed = True
        if self._cancel is not None:
            self._cancel()


class AnswerStream:
    """Iterator of answer text pieces; ``result`` is set when the stream ends.

    Generation runs in a worker thread (transformers' ``TextIteratorStreamer``); an
    exception there is re-raised here. Use the stream as a context manager or call
    :meth:`close` to stop early. The generator behind it holds no reference to the
    stream, so a stream nobody holds any more (``break`` out of ``for piece in
    engine.stream(...)``) is finalized at once: generation is cancelled, the worker is
    joined and the model's position hooks are removed.

    Made by :meth:`QGPM.stream <qgpm.QGPM.stream>` / ``stream_chat``: ``run`` takes the
    stream's :class:`StreamState` and returns the generator of pieces, which sets
    ``state.result`` when it ends.
    """

    def __init__(self, run: Callable[[StreamState], Iterator[str]], *, engine: Any = None) -> None:
        self.engine = engine
        self._state = StreamState()
        self._gen = run(self._state)

    @property
    def result(self) -> QGPMResult | None:
        """The full :class:`QGPMResult` once the stream is exhausted (``None`` before, or if closed early)."""
        return self._state.result

    def __iter__(self) -> "AnswerStream":
        return self

    def __next__(self) -> str:
        try:
            return next(self._gen)
        except ValueError as exc:  # close() from another thread is finishing the generator: the stream has ended
            if self._state.closed and "already executing" in str(exc):
                raise StopIteration from None
            raise

    def cancel(self) -> None:
        """Stop the call from any thread without waiting: a call still waiting for its turn on the
        model gives up (no pass 1, no prefill), one generating stops at its next decoding step,
        and the reader's ``next()`` then ends the stream with ``result`` ``None``. :meth:`close`
        does this and then finishes the stream."""
        self._state.close()

    def close(self) -> None:
        """Stop generation now (waits at most one decoding step) and leave the model unpatched.

        From another thread than the one reading the stream (a server's cancel handler), generation
        stops at its next decoding step and the reader's next ``next()`` ends the stream, with
        ``result`` ``None``: the reader's thread then removes the hooks, or, when the reader was
        between pieces, this call does, and a ``next()`` meanwhile ends the stream too.
        """
        self._state.close()
        try:
            self._gen.close()
        except ValueError as exc:  # the reader is inside next() in its own thread: the state's flag ends it there
            if "already executing" not in str(exc):
                raise

    def __enter__(self) -> "AnswerStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
