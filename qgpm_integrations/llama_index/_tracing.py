"""How a QGPM result travels from the LLM call to the query engine's ``Response``.

LlamaIndex's response synthesizers call ``llm.predict(...)`` / ``llm.stream(...)``, which
return plain strings, so nothing the LLM returns besides text reaches the ``Response``.
Instead, one event handler on LlamaIndex's root instrumentation dispatcher:

* on ``SynthesizeStartEvent`` opens a :class:`QGPMTrace` in a context variable (the
  handler runs in the caller's context, so the variable is visible to every LLM call the
  synthesizer makes -- in the same thread, in ``asyncio`` tasks created from it, and in
  worker threads started with ``asyncio.to_thread`` / ``contextvars.copy_context``);
* on ``SynthesizeEndEvent`` closes it and, when a :class:`QGPMLLM` call took part, puts it
  at ``response.metadata["qgpm"]``. Streaming synthesizers call the LLM lazily, while
  the response is consumed, so a streaming response's generator is wrapped to re-enter
  the trace on every step; its ``metadata["qgpm"]`` appears once the stream is consumed;
* a span handler remembers the node texts handed to ``synthesize`` / ``asynthesize``
  (after any postprocessor), as do ``RetrievalEndEvent`` and ``GetResponseStartEvent``,
  so the LLM can split the synthesizer's joined ``context_str`` back into nodes.

Nothing here changes what LlamaIndex does; handlers only read events and attach metadata.
"""

from __future__ import annotations

import contextvars
import inspect
import threading
from typing import Any, Iterable

__all__ = ["QGPMTrace", "install", "current_trace", "known_chunks", "split_context"]


class QGPMTrace(list):
    """The :class:`qgpm.QGPMResult` of every QGPM LLM call made for one response, in order.

    For ``compact`` / ``simple_summarize`` there is usually one call; ``refine`` makes one
    per chunk (the last one produced the final answer); ``tree_summarize`` summarizes
    chunks, then the summaries (the last call is the root of the tree).
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls_started = 0
        self._prev: Any = None
        self._lock = threading.Lock()

    def call_started(self) -> None:
        """Count one more LLM call that takes part in this response (thread-safe).

        A response gets ``metadata["qgpm"]`` once at least one call has started.
        """
        with self._lock:
            self.calls_started += 1

    def add_result(self, result: Any) -> None:
        """Append the result of a finished call (thread-safe)."""
        with self._lock:
            self.append(result)

    @property
    def result(self) -> Any:
        """The result of the last finished call (the final answer), or ``None``."""
        return self[-1] if self else None

    def top_sentences(self, k: int = 5) -> list[Any]:
        """``top_sentences(k)`` of the final call (``[]`` if none finished yet)."""
        return self.result.top_sentences(k) if self else []

    def explain(self, k: int = 5) -> str:
        """``explain(k)`` of every call, numbered."""
        if not self:
            return "no QGPM call has finished yet (a streaming response fills this in once consumed)"
        if len(self) == 1:
            return self[0].explain(k)
        return "\n".join(f"call {i + 1}/{len(self)}: " + r.explain(k) for i, r in enumerate(self))

    def to_html(self, **kwargs: Any) -> str:
        """The explanation page of the final call (:meth:`qgpm.QGPMResult.to_html`: the context
        shaded by relevance, the question and the answer; self-contained, all text escaped)."""
        if not self:
            raise ValueError("no QGPM call has finished yet (a streaming response fills the trace in once consumed)")
        return self.result.to_html(**kwargs)

    def __repr__(self) -> str:
        return f"QGPMTrace({len(self)} result(s): {[r.method for r in self]})"


_TRACE: contextvars.ContextVar[QGPMTrace | None] = contextvars.ContextVar("qgpm_llama_index_trace", default=None)
_CHUNKS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("qgpm_llama_index_chunks", default=())

_installed = False
_install_lock = threading.Lock()


def current_trace() -> QGPMTrace | None:
    """The trace of the synthesis running in this context, if any."""
    return _TRACE.get()


def known_chunks() -> tuple[str, ...]:
    """Node texts most recently retrieved / handed to a synthesizer in this context."""
    return _CHUNKS.get()


def _node_text(nws: Any) -> str:
    from llama_index.core.schema import MetadataMode

    node = getattr(nws, "node", nws)
    try:
        return node.get_content(metadata_mode=MetadataMode.LLM)
    except Exception:  # a node kind without text
        return ""


def install() -> None:
    """Register the event handler on the root dispatcher (once per process)."""
    global _installed
    if _installed:
        return
    with _install_lock:
        if _installed:
            return
        from llama_index.core.instrumentation import get_dispatcher
        from llama_index.core.instrumentation import NullSpanHandler
        from llama_index.core.instrumentation.event_handlers import BaseEventHandler
        from llama_index.core.response_synthesizers.base import BaseSynthesizer
        from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent
        from llama_index.core.instrumentation.events.synthesis import (
            GetResponseStartEvent,
            SynthesizeEndEvent,
            SynthesizeStartEvent,
        )

        class QGPMEventHandler(BaseEventHandler):
            @classmethod
            def class_name(cls) -> str:
                return "QGPMEventHandler"

            def handle(self, event: Any, **kwargs: Any) -> None:
                if isinstance(event, SynthesizeStartEvent):
                    trace = QGPMTrace()
                    trace._prev = _TRACE.get()
                    _TRACE.set(trace)
                elif isinstance(event, SynthesizeEndEvent):
                    trace = _TRACE.get()
                    if trace is None:
                        return
                    _TRACE.set(trace._prev)
                    trace._prev = None
                    response = event.response
                    _attach(response, trace)
                    gen = getattr(response, "response_gen", None)
                    if inspect.isgenerator(gen):
                        response.response_gen = _wrap_gen(gen, trace, response)
                    elif inspect.isasyncgen(gen):
                        response.response_gen = _wrap_agen(gen, trace, response)
                elif isinstance(event, RetrievalEndEvent):
                    _CHUNKS.set(tuple(t for t in (_node_text(n) for n in event.nodes or []) if t.strip()))
                elif isinstance(event, GetResponseStartEvent):
                    # compact passes already packed chunks: keep the retrieved nodes too
                    old = _CHUNKS.get()
                    new = tuple(t for t in (event.text_chunks or []) if isinstance(t, str) and t.strip() and t not in old)
                    if new:
                        _CHUNKS.set(old + new)

        class QGPMSpanHandler(NullSpanHandler):
            """Remembers the nodes handed to a synthesizer (after any postprocessor)."""

            @classmethod
            def class_name(cls) -> str:
                return "QGPMSpanHandler"

            def span_enter(self, id_: str, bound_args: Any, instance: Any = None, parent_id: Any = None, tags: Any = None, **kwargs: Any) -> None:
                if instance is None or not isinstance(instance, BaseSynthesizer):
                    return
                if not (".synthesize-" in id_ or ".asynthesize-" in id_):
                    return
                nodes = bound_args.arguments.get("nodes")
                if nodes:
                    _CHUNKS.set(tuple(t for t in (_node_text(n) for n in nodes) if t.strip()))

        dispatcher = get_dispatcher()
        dispatcher.add_event_handler(QGPMEventHandler())
        dispatcher.add_span_handler(QGPMSpanHandler())
        _installed = True


def _attach(response: Any, trace: QGPMTrace) -> None:
    if trace.calls_started and hasattr(response, "metadata"):
        if response.metadata is None:
            response.metadata = {}
        response.metadata.setdefault("qgpm", trace)


def _enter(trace: QGPMTrace) -> Any:
    return _TRACE.set(trace)


def _leave(token: Any) -> None:
    try:
        _TRACE.reset(token)
    except ValueError:  # resumed from another context (thread): just clear it there
        _TRACE.set(token.old_value if token.old_value is not contextvars.Token.MISSING else None)


def _wrap_gen(gen: Any, trace: QGPMTrace, response: Any) -> Any:
    """Streaming responses call the LLM lazily, while they are consumed: re-enter the trace."""

    def wrapped() -> Any:
        try:
            while True:
                token = _enter(trace)
                try:
                    item = next(gen)
                except StopIteration:
                    return
                finally:
                    _leave(token)
                yield item
        finally:
            gen.close()
            _attach(response, trace)

    return wrapped()


def _wrap_agen(gen: Any, trace: QGPMTrace, response: Any) -> Any:
    async def wrapped() -> Any:
        try:
            while True:
                token = _enter(trace)
                try:
                    item = await gen.__anext__()
                except StopAsyncIteration:
                    return
                finally:
                    _leave(token)
                yield item
        finally:
            await gen.aclose()
            _attach(response, trace)

    return wrapped()


def split_context(text: str, chunks: Iterable[str] = ()) -> str | list[str]:
    """Split a synthesizer's joined context back into node texts.

    Synthesizers join node texts with ``"\\n\\n"`` (compact / refine / tree_summarize) or
    ``"\\n"`` (simple_summarize) and may re-split or truncate the result to fit the window.
    A boundary is placed wherever a known node text begins at the start of the context or
    right after a line break (matched on its first 200 characters). Pieces before the first
    match (a node cut at its start) stay separate documents. Without any match the context
    is returned as one string.
    """
    heads = []
    for c in chunks:
        c = c.strip()
        if c:
            heads.append(c[:200])
    starts = set()
    for head in heads:
        pos = text.find(head)
        while pos >= 0:
            if pos == 0 or text[pos - 1] == "\n" or not text[:pos].strip():
                starts.add(pos)
            pos = text.find(head, pos + 1)
    starts = sorted(p for p in starts if text[:p].strip())
    if not starts:
        return text
    pieces = []
    prev = 0
    for p in starts + [len(text)]:
        piece = text[prev:p].strip()
        if piece:
            pieces.append(piece)
        prev = p
    return pieces if len(pieces) > 1 else text
