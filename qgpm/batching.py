"""Many calls in flight on one engine: a thread pool, and the bridge to ``asyncio``.

Pass 1 and an in-process pass 2 hold the model's lock, so on a local model the calls run one
after another (concurrency adds nothing but order). With a remote generator
(:class:`qgpm.serving.VLLMServer`) only pass 1 holds the lock: while one call runs pass 1 here,
the others are prefilled and decoded on the server, which batches them. Pass 1 itself is not
batched: on a CPU its partial prefill is compute-bound, so several prompts in one forward cost
what they cost one after another.
"""

from __future__ import annotations

import asyncio
import functools
import numbers
from collections.abc import Mapping
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Sequence

__all__ = ["answer_many", "aanswer"]


def answer_many(engine: Any, requests: Sequence[Mapping[str, Any]], *, max_concurrency: int = 8) -> list[Any]:
    """``engine.answer(**request)`` for every request, at most ``max_concurrency`` in flight;
    the results in the requests' order. Every request is checked before any runs (a mapping with
    ``context`` and ``question``, and ``engine.check_request`` of its arguments: a bad request
    raises, naming its index, and nothing runs). When a call fails while running, the calls not
    started yet are cancelled (no result is returned, so their work would be lost), the ones
    already running finish, and the first failed request's exception is raised with the note
    "in request i of answer_many()"."""
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, numbers.Integral) or max_concurrency < 1:
        raise ValueError(f"max_concurrency must be an int >= 1, got {max_concurrency!r}")
    if isinstance(requests, (str, bytes, Mapping)):
        raise TypeError("requests must be a list of dicts, each with 'context' and 'question' (and answer()'s keyword arguments)")
    reqs = list(requests)
    for i, r in enumerate(reqs):
        if not isinstance(r, Mapping) or "context" not in r or "question" not in r:
            raise TypeError(f"request {i} must be a dict with 'context' and 'question', got {type(r).__name__}")
    if not reqs:
        return []
    for i, r in enumerate(reqs):
        try:
            engine.check_request(**r)
        except (TypeError, ValueError) as exc:  # PromptError and ContextTooLongError are ValueErrors too
            exc.add_note(f"in request {i} of answer_many()")
            raise
    with ThreadPoolExecutor(max_workers=min(max_concurrency, len(reqs)), thread_name_prefix="qgpm-call") as pool:
        futures = [pool.submit(functools.partial(engine.answer, **r)) for r in reqs]
        wait(futures, return_when=FIRST_EXCEPTION)
        failed = [i for i, f in enumerate(futures) if f.done() and not f.cancelled() and f.exception() is not None]
        if failed:
            for f in futures:
                f.cancel()  # not started yet: never runs; running ones finish as the pool closes
            exc = futures[failed[0]].exception()
            exc.add_note(f"in request {failed[0]} of answer_many()")
            raise exc
        return [f.result() for f in futures]


async def aanswer(engine: Any, context: Any, question: str, **kwargs: Any) -> Any:
    """``engine.answer`` without blocking the event loop (in a worker thread)."""
    return await asyncio.to_thread(functools.partial(engine.answer, context, question, **kwargs))
