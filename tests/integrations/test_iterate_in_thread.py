"""qgpm_integrations._common.iterate_in_thread: a blocking stream driven from asyncio code (no framework, no model)."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import aclosing

import pytest

from qgpm_integrations._common import iterate_in_thread


class SlowStream:
    """A blocking iterator that records which threads ran it and whether it was closed."""

    def __init__(self, n: int, delay: float = 0.02) -> None:
        self.n, self.delay = n, delay
        self.threads: set[int] = set()
        self.closed = False
        self.i = 0

    def __iter__(self) -> SlowStream:
        return self

    def __next__(self) -> int:
        self.threads.add(threading.get_ident())
        if self.i >= self.n or self.closed:
            raise StopIteration
        time.sleep(self.delay)
        self.i += 1
        return self.i

    def close(self) -> None:
        self.closed = True


def test_items_come_from_worker_threads_and_the_stream_is_closed():
    stream = SlowStream(3)

    async def main():
        return [x async for x in iterate_in_thread(stream)], threading.get_ident()

    items, loop_thread = asyncio.run(main())
    assert items == [1, 2, 3] and stream.closed
    assert loop_thread not in stream.threads


def test_closing_early_closes_the_stream_before_returning():
    stream = SlowStream(100)

    async def main():
        async with aclosing(iterate_in_thread(stream)) as items:
            async for x in items:
                if x == 2:
                    break
        return stream.closed

    assert asyncio.run(main())
    assert stream.i == 2


def test_cancelling_waits_for_the_running_step_then_closes():
    stream = SlowStream(100, delay=0.2)

    async def main():
        async def consume():
            async for _ in iterate_in_thread(stream):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)  # the first next() is running in its thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return stream.closed

    assert asyncio.run(main())
