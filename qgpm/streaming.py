"""Streaming: the answer text piece by piece, under the same stop rules as a whole answer.

:func:`stream_text` turns a generator's raw pieces (:class:`~qgpm.generation.PieceStream`)
into the pieces a caller sees: nothing past a stop string (the generation is cancelled there),
text that could still become a stop string held back, no leading or trailing whitespace, and
the final pieces made equal to the finished answer (:func:`~qgpm.decoding.finish_text`).
"""

from __future__ import annotations

from typing import Callable, Iterator, TypeVar

from .decoding import Decoding, cut_at_stop, finish_text
from .generation import Generated, PieceStream
from .runtime import CallCancelled, cancelled_by

__all__ = ["stream_text", "unless_closed"]

_T = TypeVar("_T")


def unless_closed(work: Callable[[], _T], closed: Callable[[], bool]) -> _T | None:
    """``work()`` (a stream's preparation), given up with ``None`` where the stream is closed
    before it or while it waits for its turn on the model (:func:`~qgpm.runtime.cancelled_by`):
    a closed stream's call runs no pass 1 and no prefill."""
    if closed():
        return None
    try:
        with cancelled_by(closed):
            out = work()
    except CallCancelled:
        return None
    return None if closed() else out


def stream_text(pieces: PieceStream, decoding: Decoding, done: Callable[[Generated], None], *,
                closed: Callable[[], bool] = lambda: False) -> Iterator[str]:
    """Yield the visible answer pieces of ``pieces``; when it ends, call ``done(generated)``. The
    pieces add up to the finished answer (:func:`~qgpm.decoding.finish_text`). Closing this
    generator cancels ``pieces``; so does ``closed()`` turning true (a close from another
    thread), after which nothing more is yielded and ``done`` is not called."""
    stop = decoding.stop
    emitted = ""
    full = ""
    hold = max((len(s) for s in stop), default=1) - 1
    it = iter(pieces)
    try:
        for piece in it:
            if closed():
                return
            full += piece
            visible, stopped = cut_at_stop(full, stop)
            if stopped:
                pieces.cancel()
            else:
                visible = visible[: len(visible) - hold] if hold > 0 else visible
            visible = visible.strip()  # trailing whitespace waits for what follows
            if len(visible) > len(emitted) and visible.startswith(emitted):
                yield visible[len(emitted) :]
                emitted = visible
        if closed():
            return
        generated = pieces.generated
        if generated is None:
            raise RuntimeError("the generator's stream ended without its result")
        text, _ = finish_text(generated.text, len(generated.token_ids), decoding)
        if text.startswith(emitted) and len(text) > len(emitted):
            yield text[len(emitted) :]
        done(generated)
    finally:
        pieces.cancel()
        close = getattr(it, "close", None)
        if close is not None:  # ends the generator's own work (a worker thread, an HTTP response)
            close()
