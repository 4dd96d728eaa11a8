"""The pacer lets records out in slices, never one per event-loop turn."""

from __future__ import annotations

import asyncio

import pytest

from aiostream_ckpt.aio import Wakeup
from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.connectors.pacing import (
    MAX_PACING_SLEEP,
    MIN_PACING_SLEEP,
    MIN_PACING_SLICE,
    Pacer,
)
from tests.helpers import wait_until


class SteppingClock:
    """Time moves only by what is slept (as if nothing else ran); records every sleep."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(0.0, seconds)


@pytest.mark.parametrize("rate", [50.0, 5_000.0, 1_000_000.0])
async def test_pacer_lets_out_slices_at_the_rate(rate: float) -> None:
    """A reader asking for 2048 at a time for 2 s of its clock: the rate, in few slices.

    The old pacer let a record out as soon as one was due: at 5,000/s a call
    per record and sleeps of 0.2 ms, which uvloop returns from at once (a
    spinning event loop).
    """
    clock = SteppingClock()
    pacer = Pacer(rate, clock)
    calls = total = 0
    while clock.now < 2.0 and calls < 5_000:
        n = await pacer.allowance(2048)
        assert 0 <= n <= 2048
        pacer.emitted(n)
        calls += 1
        total += n
        assert total <= rate * clock.now + 1  # never ahead of the rate
    assert clock.now >= 2.0, f"{calls} calls let out {total} records in {clock.now:.4f} s"
    assert total >= rate * 2.0 - max(2048, rate * MIN_PACING_SLICE) - 1  # nor behind it
    assert all(MIN_PACING_SLEEP <= s <= MAX_PACING_SLEEP for s in clock.sleeps)
    slices = max(total / 2048, 2.0 / max(MIN_PACING_SLICE, 1 / rate))
    assert calls <= 1.2 * slices + 3


async def test_pacer_catches_up_after_a_stall() -> None:
    """Records due while the reader was away go out at once, up to what it asks for."""
    clock = SteppingClock()
    pacer = Pacer(1000.0, clock)
    pacer.emitted(await pacer.allowance(10))
    clock.now += 1.0
    n = await pacer.allowance(2048)
    assert 990 <= n <= 1001
    assert clock.sleeps[-1:] != [] and len(clock.sleeps) <= 2


async def test_a_pending_barrier_ends_the_wait_early() -> None:
    """At 10 events/s the pacer sleeps 50 ms at a time: a barrier waited for it (25 ms mean)."""
    clock = ManualClock()
    wakeup = Wakeup()
    pacer = Pacer(10.0, clock, wakeup)
    asking = asyncio.create_task(pacer.allowance(1))
    await wait_until(lambda: clock.sleepers == 1)  # the pacer sleeps
    wakeup.set()  # the source task was told to inject a barrier
    assert await asyncio.wait_for(asking, 5) == 0  # nothing due yet: the task takes the barrier
    assert clock.monotonic() == 0.0 and clock.sleepers == 0
    assert await pacer.allowance(1) == 0  # still pending: no sleep until the task clears it
    wakeup.clear()
    asking = asyncio.create_task(pacer.allowance(1))
    await wait_until(lambda: clock.sleepers == 1)  # cleared: it sleeps until a record is due
    clock.advance(0.2)
    assert await asyncio.wait_for(asking, 5) == 1


async def test_a_cancelled_reader_is_not_taken_for_a_woken_one() -> None:
    """Cancelling the task that sleeps cancels it (the wakeup only ends the sleep)."""
    clock = ManualClock()
    wakeup = Wakeup()
    asking = asyncio.create_task(Pacer(10.0, clock, wakeup).allowance(1))
    await wait_until(lambda: clock.sleepers == 1)
    asking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asking
    wakeup.set()  # nothing sleeps: nothing to end
    assert clock.sleepers == 0
