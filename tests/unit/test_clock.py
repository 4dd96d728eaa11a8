"""The system clock's sleep keeps its word on uvloop, whose timers count whole milliseconds.

uvloop returns from ``asyncio.sleep(x)`` with ``x`` under 0.5 ms at once, so
``Clock.sleep`` ("until ``seconds`` have passed") did not suspend at all, and
any loop waiting for a deadline under a millisecond away spun the event loop
(a paced source at 5,000 events/s: 12.8 s of CPU in 21 s).
"""

from __future__ import annotations

import time

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
    # sleep(0) and a deadline already passed still only yield
    assert uvloop.run(naps(20, 0.0)) < 20 * MIN_SLEEP
    assert uvloop.run(naps(20, -1.0)) < 20 * MIN_SLEEP
