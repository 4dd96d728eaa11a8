"""Injected time.

The coordinator, restart strategies, TTL and timers read time through a
:class:`Clock` so tests drive time forward instead of sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable
from typing import Protocol, TypeVar

T = TypeVar("T")

#: The shortest real sleep. An event loop's timers count whole milliseconds, and uvloop's
#: returns from a sleep under 0.5 ms at once: a loop that waited for a deadline
#: under a millisecond away (a paced source's next record at 5,000/s) spun the event loop.
MIN_SLEEP = 0.001


class Clock(Protocol):
    """Wall-clock and monotonic time, and a way to wait on them."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch (for timestamps shown to people)."""
        ...

    def monotonic(self) -> float:
        """Monotonic seconds (for intervals, timeouts, pauses)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Suspend until ``seconds`` of this clock's monotonic time have passed."""
        ...


class SystemClock:
    """The real clock; a positive sleep lasts at least :data:`MIN_SLEEP`."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0.0 if seconds <= 0 else max(seconds, MIN_SLEEP))


class ManualClock:
    """A clock that moves only when a test calls :meth:`advance`.

    >>> clock = ManualClock(start=100.0)
    >>> clock.monotonic()
    100.0
    >>> clock.advance(2.5)
    >>> clock.monotonic()
    102.5
    """

    def __init__(self, start: float = 0.0, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_offset
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self._wall_offset + self._now

    def monotonic(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has passed."""
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    @property
    def sleepers(self) -> int:
        """How many coroutines are waiting on this clock."""
        return sum(1 for _, _, f in self._sleepers if not f.done())


async def wait_within(aw: Awaitable[T], seconds: float, clock: Clock) -> T:
    """``asyncio.wait_for`` on ``clock``'s time: ``aw``'s result, or TimeoutError past ``seconds``.

    ``aw`` is cancelled (and awaited) when the time is up or the caller is
    cancelled. On the injected clock, a grace or a timeout is a test's to move
    past, not a real wait.
    """
    work = asyncio.ensure_future(aw)
    deadline = asyncio.ensure_future(clock.sleep(seconds))
    timed_out = True
    try:
        await asyncio.wait({work, deadline}, return_when=asyncio.FIRST_COMPLETED)
        timed_out = not work.done()
    finally:
        deadline.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    if timed_out:
        raise TimeoutError(f"not done within {seconds:g}s")
    return work.result()
