"""The system clock's sleep keeps its word on uvloop, whose timers count whole milliseconds.

uvloop returns from ``asyncio.sleep(x)`` with ``x`` under 0.5 ms at once, so
``Clock.sleep`` ("until ``seconds`` have passed") did not suspend at all, and
any loop waiting for a deadline under a millisecond away spun the event loop
(a paced source at 5,000 events/s: 12.8 s of CPU in 21 s).
"""

from __future__ import annotations

import asyncio
import time

import pytest
import uvloop

from aiostream_ckpt.clock import MIN_SLEEP, SystemClock


def test_a_short_sleep_on_uvloop_lasts_at_least_what_was_asked() -> None:
    async def naps(n: int, seconds: float) -> float:
        clock = SystemClock()
        start = time.monotonic()
        for _ in range(n):
            await clock.sleep(seconds)
        return time.monotonic() - start

    # old code: 20 sleeps of 0.2 ms took ~0.6 ms in all, under the 4 ms asked for
    assert uvloop.run(naps(20, 0.0002)) >= 20 * 0.0002


def test_sleep_zero_or_a_deadline_passed_only_yields(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the loop is asked for, not how long it took: a loaded machine adds to that."""
    asked: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        asked.append(delay)
        await real_sleep(delay)

    async def naps() -> None:
        clock = SystemClock()
        for seconds in (0.0, -1.0, 0.0002, 0.002):
            await clock.sleep(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    uvloop.run(naps())
    # 0 is asyncio's bare yield (no timer); a positive sleep is one of at least MIN_SLEEP
    assert asked == [0.0, 0.0, MIN_SLEEP, 0.002]
