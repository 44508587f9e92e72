"""Many calls in flight on one engine: a thread pool, and the bridge to ``asyncio``.

Pass 1 and an in-process pass 2 hold the model's lock, so on a local model the calls run one
after another (concurrency adds nothing but order). With a remote generator
(:class:`qgpm.serving.VLLMServer`) only pass 1 holds the lock: while one call runs pass 1 here,
the others are prefilled and decoded on the server, which batches them. Pass 1 itself is not
batched: on a CPU its partial prefill is compute-bound, so several prompts in one forward cost
what they cost one after another.

The ``asyncio`` side (:func:`aanswer`, :func:`iterate_in_thread`) steps blocking streams in
the threads of one pool of its own (:data:`ASYNC_WORKERS`), not the event loop's default
executor, whose ``cpu_count() + 4`` threads would cap the calls in flight on a server.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import numbers
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import aclosing
from typing import Any, Callable, Sequence, TypeVar

from .runtime import CallCancelled, cancelled_by

__all__ = ["answer_many", "aanswer", "iterate_in_thread", "Cancellable", "ASYNC_WORKERS"]


def answer_many(engine: Any, requests: Sequence[Mapping[str, Any]], *, max_concurrency: int = 8) -> list[Any]:
    """``engine.answer(**request)`` for every request, at most ``max_concurrency`` in flight;
    the results in the requests' order. Every request is checked before any runs (a mapping with
    ``context`` and ``question``, and ``engine.check_request`` of its arguments: a bad request
    raises, naming its index, and nothing runs). When a call fails while running, the calls not
    started yet are cancelled (no result is returned, so their work would be lost): those still
    waiting in the pool or for a turn on the model (:func:`~qgpm.runtime.cancelled_by`) run
    nothing more on it; the ones holding the model finish, and the first failed request's
    exception is raised with the note "in request i of answer_many()". An interrupt of the
    calling thread (``KeyboardInterrupt``) cancels the same way."""
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, numbers.Integral) or max_concurrency < 1:
        raise ValueError(f"max_concurrency must be an int >= 1, got {max_concurrency!r}")
    if isinstance(requests, (str, bytes, Mapping)):
        raise TypeError("requests must be a list of dicts, each with 'context' and 'question' (and answer()'s keyword arguments)")
    reqs = list(requests)
    for i, r in enumerate(reqs):
        if not isinstance(r, Mapping):
            raise TypeError(f"request {i} must be a dict with 'context' and 'question', got {type(r).__name__}")
        missing = [key for key in ("context", "question") if key not in r]
        if missing:
            raise TypeError(f"request {i} has no {' and no '.join(repr(k) for k in missing)} (its keys: {sorted(map(str, r))}); "
                            "each request needs 'context' and 'question', beside answer()'s keyword arguments")
    if not reqs:
        return []
    for i, r in enumerate(reqs):
        try:
            engine.check_request(**r)
        except (TypeError, ValueError) as exc:  # PromptError and ContextTooLongError are ValueErrors too
            exc.add_note(f"in request {i} of answer_many()")
            raise
    stop = threading.Event()  # set by the first call that fails: the others still waiting give up

    def call(request: Mapping[str, Any]) -> Any:
        if stop.is_set():
            raise CallCancelled("answer_many: another request failed before this one started")
        try:
            with cancelled_by(stop.is_set, on_failure=stop.set):  # queued behind the model's lock: gives up once one fails
                return engine.answer(**request)
        except CallCancelled:
            raise
        except BaseException:
            stop.set()
            raise

    with ThreadPoolExecutor(max_workers=min(max_concurrency, len(reqs)), thread_name_prefix="qgpm-call") as pool:
        futures = [pool.submit(call, r) for r in reqs]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:  # the caller's own interrupt (Ctrl-C): the calls waiting give up, as after a failure
            stop.set()
            for f in futures:
                f.cancel()
            raise
        if any(f.exception() is not None for f in done):
            stop.set()
            for f in futures:
                f.cancel()  # not started yet: never runs
            wait(futures)  # the running ones finish; the waiting ones give up (CallCancelled)
            failed = [i for i, f in enumerate(futures)
                      if not f.cancelled() and f.exception() is not None and not isinstance(f.exception(), CallCancelled)]
            exc = futures[failed[0]].exception()
            exc.add_note(f"in request {failed[0]} of answer_many()")
            raise exc
        return [f.result() for f in futures]


ASYNC_WORKERS = 64
"""Threads that step blocking streams for ``asyncio`` code: as many calls can wait at once (the
default ``VLLMServer(max_connections=64)``). Threads start as they are needed."""

_T = TypeVar("_T")
_END = object()
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=ASYNC_WORKERS, thread_name_prefix="qgpm-async")
        return _POOL


async def _in_thread(fn: Callable[[], _T]) -> _T:
    """``fn()`` in a thread of the pool, with the caller's context variables (as ``asyncio.to_thread``)."""
    ctx = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_pool(), functools.partial(ctx.run, fn))


class Cancellable(Iterator[_T]):
    """``iterator`` (an adapter's generator over a stream) with the stream's ``cancel``, so
    :func:`iterate_in_thread` can stop a call still waiting for the model without waiting for it."""

    def __init__(self, iterator: Iterator[_T], cancel: Callable[[], None]) -> None:
        self._it, self.cancel = iterator, cancel

    def __next__(self) -> _T:
        return next(self._it)

    def close(self) -> None:
        closer = getattr(self._it, "close", None)
        if closer is not None:
            closer()


async def iterate_in_thread(iterator: Iterator[_T]) -> AsyncIterator[_T]:
    """Drive a blocking ``iterator`` (a generation stream) from worker threads, one item at a time,
    so the event loop stays free while the model works.

    However the loop is left -- exhausted, ``aclose()``, cancelled -- the iterator is closed in a
    worker thread too, once a ``next()`` still running there has returned: a generation behind
    it is stopped and its thread joined before this generator finishes. An iterator with a
    ``cancel()`` (:class:`~qgpm.results.AnswerStream`) is cancelled first, so a call still
    waiting for the model gives up instead of running its pass 1 and prefill. An ``async for`` that
    stops early does not close what it iterates: wrap the call in ``contextlib.aclosing`` so
    the close happens then and not when the event loop finalizes the generator.
    """
    guard = threading.Lock()  # close() waits for an in-flight next() (a generator cannot be closed while it runs)

    def step() -> Any:
        with guard:
            return next(iterator, _END)

    def close() -> None:
        with guard:
            closer = getattr(iterator, "close", None)
            if closer is not None:
                closer()

    finished = False
    try:
        while True:
            item = await _in_thread(step)
            if item is _END:
                finished = True
                break
            yield item
    finally:
        stop = getattr(iterator, "cancel", None)  # non-blocking: signalled here, not from a pool thread (all may be busy)
        if not finished and callable(stop):
            stop()  # an AnswerStream's next() in flight then returns at once, not after its pass 1 and prefill
        await asyncio.shield(_in_thread(close))


async def aanswer(engine: Any, context: Any, question: str, **kwargs: Any) -> Any:
    """``engine.answer`` for ``asyncio`` code, without blocking the event loop: the call runs as
    ``engine.stream`` stepped from worker threads, and its result is the stream's (the same
    answer). The arguments are checked at once. Cancelling the awaiting task stops the call once
    the piece in progress arrives: in-process generation is stopped, and a vLLM server's request
    is closed, which ends it there."""
    stream = engine.stream(context, question, **kwargs)
    async with aclosing(iterate_in_thread(stream)) as pieces:
        async for _ in pieces:
            pass
    return stream.result
