"""The pacer lets records out in slices, never one per event-loop turn."""

from __future__ import annotations

import pytest

from aiostream_ckpt.connectors.pacing import (
    MAX_PACING_SLEEP,
    MIN_PACING_SLEEP,
    MIN_PACING_SLICE,
    Pacer,
)


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
