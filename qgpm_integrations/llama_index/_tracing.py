"""``QGPMTrace``: the QGPM results behind one LlamaIndex response, at ``response.metadata["qgpm"]``.

Built on LlamaIndex's public instrumentation: one event handler on the root dispatcher
(registered once per process, when the first :class:`QGPMLLM` is built) that

* on ``SynthesizeStartEvent`` opens a :class:`QGPMTrace` in a context variable. The
  handler runs in the synthesizer's own context, so every QGPM call the synthesis makes --
  in the same thread, in ``asyncio`` tasks created from it, and in worker threads started
  with ``asyncio.to_thread`` -- sees it;
* on ``SynthesizeEndEvent`` closes it and, when a QGPM call took part, puts it at
  ``response.metadata["qgpm"]``.

A QGPM call (of :class:`QGPMLLM` or :class:`QGPMSynthesizer`) joins the trace that is
open when the call starts and adds its result when it finishes. Streaming synthesizers may
call the LLM only while their response is read, after the synthesis has ended, so a
streaming response's generator is wrapped to reopen the trace on every step; its
``metadata["qgpm"]`` is complete once the stream has been read. The handler only reads
events, adds metadata and wraps response generators; it changes nothing LlamaIndex does.
"""

from __future__ import annotations

import contextvars
import inspect
import threading
from typing import Any, Optional

from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.synthesis import SynthesizeEndEvent, SynthesizeStartEvent

from qgpm.explain import check_count

__all__ = ["QGPMTrace", "install", "current_trace"]


class QGPMTrace(list):
    """The :class:`qgpm.QGPMResult` of every QGPM call made for one response, in order.

    :class:`QGPMSynthesizer` makes one call per response. Through :class:`QGPMLLM` a
    ``compact`` / ``simple_summarize`` synthesizer usually makes one, ``refine`` one per
    chunk (the last one gave the final answer), ``tree_summarize`` one per node of the tree
    (the last one is the root). The trace reads as its final result: ``trace.text``,
    ``trace.relevance``, ``trace.method``, ... are those of ``trace.result``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls_started = 0
        self._lock = threading.Lock()
        self._span: Optional[str] = None  # the synthesis span it belongs to

    def call_started(self) -> None:
        """Count one more QGPM call that takes part in this response (thread-safe)."""
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

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if not self:
            raise AttributeError(f"QGPMTrace has no {name!r}: no QGPM call has finished yet (a streaming response fills the trace in once read)")
        return getattr(self[-1], name)

    def top_sentences(self, k: int = 5) -> list[Any]:
        """``top_sentences(k)`` of the final call (``[]`` if none finished yet)."""
        check_count(k, "k")
        return self.result.top_sentences(k) if self else []

    def explain(self, k: int = 5) -> str:
        """``explain(k)`` of every call, numbered when there are several."""
        check_count(k, "k")
        if not self:
            return "no QGPM call has finished yet (a streaming response fills the trace in once read)"
        if len(self) == 1:
            return self[0].explain(k)
        return "\n".join(f"call {i + 1}/{len(self)}: " + r.explain(k) for i, r in enumerate(self))

    def to_html(self, **kwargs: Any) -> str:
        """The explanation page of the final call (:meth:`qgpm.QGPMResult.to_html`: the context
        shaded by relevance, the question and the answer; self-contained, all text escaped)."""
        if not self:
            raise ValueError("no QGPM call has finished yet (a streaming response fills the trace in once read)")
        return self.result.to_html(**kwargs)

    def __repr__(self) -> str:
        return f"QGPMTrace({len(self)} result(s): {[r.method for r in self]})"


# the open traces of the syntheses this context is inside, innermost last
_OPEN: contextvars.ContextVar[tuple[QGPMTrace, ...]] = contextvars.ContextVar("qgpm_llama_index_traces", default=())

_installed = False
_install_lock = threading.Lock()


def current_trace() -> Optional[QGPMTrace]:
    """The trace of the synthesis running in this context, if any."""
    open_ = _OPEN.get()
    return open_[-1] if open_ else None


def _attach(response: Any, trace: QGPMTrace) -> None:
    if trace.calls_started and hasattr(response, "metadata"):
        if response.metadata is None:
            response.metadata = {}
        response.metadata.setdefault("qgpm", trace)


def _reopened(trace: QGPMTrace) -> contextvars.Token:
    return _OPEN.set(_OPEN.get() + (trace,))


def _wrap_gen(gen: Any, trace: QGPMTrace, response: Any) -> Any:
    """``gen`` with ``trace`` open during each step; the trace is attached once ``gen`` ends."""

    def wrapped() -> Any:
        try:
            while True:
                token = _reopened(trace)
                try:
                    item = next(gen)
                except StopIteration:
                    return
                finally:
                    _OPEN.reset(token)
                yield item
        finally:
            gen.close()
            _attach(response, trace)

    return wrapped()


def _wrap_agen(gen: Any, trace: QGPMTrace, response: Any) -> Any:
    """:func:`_wrap_gen` for an async generator."""

    async def wrapped() -> Any:
        try:
            while True:
                token = _reopened(trace)
                try:
                    item = await gen.__anext__()
                except StopAsyncIteration:
                    return
                finally:
                    _OPEN.reset(token)
                yield item
        finally:
            await gen.aclose()
            _attach(response, trace)

    return wrapped()


def _close(response: Any, trace: QGPMTrace) -> None:
    """Attach ``trace`` to a finished synthesis's response (and to its stream's end)."""
    _attach(response, trace)
    gen = getattr(response, "response_gen", None)
    if inspect.isgenerator(gen):
        response.response_gen = _wrap_gen(gen, trace, response)
    elif inspect.isasyncgen(gen):
        response.response_gen = _wrap_agen(gen, trace, response)


def install() -> None:
    """Register the event handler on LlamaIndex's root dispatcher (once per process)."""
    global _installed
    if _installed:
        return
    with _install_lock:
        if _installed:
            return
        class QGPMTraceHandler(BaseEventHandler):
            """Opens a :class:`QGPMTrace` per synthesis and attaches it to the response."""

            @classmethod
            def class_name(cls) -> str:
                return "QGPMTraceHandler"

            def handle(self, event: Any, **kwargs: Any) -> None:
                if isinstance(event, SynthesizeStartEvent):
                    trace = QGPMTrace()
                    trace._span = event.span_id
                    _OPEN.set(_OPEN.get() + (trace,))
                elif isinstance(event, SynthesizeEndEvent):
                    open_ = _OPEN.get()
                    # the trace of this synthesis, and any left open inside it by a synthesis that raised
                    at = next((i for i in range(len(open_) - 1, -1, -1) if open_[i]._span == event.span_id), len(open_) - 1)
                    if at >= 0:
                        _OPEN.set(open_[:at])
                        _close(event.response, open_[at])

        get_dispatcher().add_event_handler(QGPMTraceHandler())
        _installed = True
