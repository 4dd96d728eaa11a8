"""In-memory event-time timers (``DerivedEventTimers``, a calendar queue) fire as a heap would."""

from __future__ import annotations

import heapq
import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.state.backend import KeyContext
from aiostream_ckpt.time.timers import DerivedEventTimers, InternalTimerService
from tests.unit.time.support import window_backend


class _Backend:
    def __init__(self) -> None:
        self.key_context = KeyContext()


class _HeapTimers:
    """The reference: a heap of ``(timestamp, sequence, key)``, as the timer service keeps."""

    def __init__(self, kc: KeyContext) -> None:
        self._kc, self._heap, self._live = kc, [], set()
        self._seq = itertools.count()

    def register_event_time_timer(self, timestamp: int) -> None:
        entry = (timestamp, self._kc.key)
        if entry not in self._live:
            self._live.add(entry)
            heapq.heappush(self._heap, (timestamp, next(self._seq), entry[1]))

    def advance_watermark(self, watermark: int, on_timer: Any) -> None:
        while self._heap and self._heap[0][0] <= watermark:
            ts, _, key = heapq.heappop(self._heap)
            self._live.discard((ts, key))
            self._kc.key = key
            later = on_timer(ts, key)
            if later is not None:  # the callback's re-arm: a timer set for its key
                self.register_event_time_timer(later)


def _drive(timers: Any, kc: KeyContext, seed: int) -> list[Any]:
    """Random timers (dense, sparse, equal times, negative), some set or re-armed as others fire."""
    rng = random.Random(seed)
    fired: list[Any] = []
    watermark = -5_000

    def on_timer(ts: int, key: Any) -> int | None:
        fired.append((ts, key, kc.key))
        if rng.random() < 0.4:  # set one more: often due in this same advance
            kc.key = rng.choice("abcd")
            timers.register_event_time_timer(ts + rng.choice([-3_000, 0, 1, 700, 2_000, 9_000]))
            kc.key = key
        if rng.random() < 0.3:  # re-arm its own key's timer by returning the time
            return int(ts + rng.choice([-3_000, 0, 1, 700, 2_000, 9_000]))
        return None

    for _ in range(300):
        for _ in range(rng.randint(0, 12)):
            kc.key = rng.choice("abcdefg")
            timers.register_event_time_timer(watermark + rng.choice([1, 5, 5, 900, 1_024, 6_000]))
        watermark += rng.choice([0, 1, 3, 500, 1_023, 1_024, 4_000])
        timers.advance_watermark(watermark, on_timer)
        fired.append(("watermark", watermark))
    timers.advance_watermark(1 << 40, on_timer)
    return fired


@pytest.mark.parametrize("seed", range(8))
def test_fires_as_a_heap_would(seed: int) -> None:
    backend, want_kc = _Backend(), KeyContext()
    got = DerivedEventTimers(backend)  # type: ignore[arg-type]
    want = _HeapTimers(want_kc)
    assert _drive(got, backend.key_context, seed) == _drive(want, want_kc, seed)
    assert got.pending() == (0, 0)


def test_timers_after_one_that_raised_stay_pending() -> None:
    backend = _Backend()
    timers = DerivedEventTimers(backend)  # type: ignore[arg-type]
    kc = backend.key_context
    for key, ts in (("a", 10), ("b", 20), ("c", 30), ("d", 5_000)):
        kc.key = key
        timers.register_event_time_timer(ts)
    fired: list[Any] = []

    def on_timer(ts: int, key: Any) -> None:
        if key == "b" and not fired.count((ts, key)):
            fired.append((ts, key))
            raise RuntimeError("boom")
        fired.append((ts, key))

    with pytest.raises(RuntimeError):
        timers.advance_watermark(100, on_timer)
    assert fired == [(10, "a"), (20, "b")]
    assert timers.pending() == (2, 0)  # b fired (as a heap pops it first); c and d wait
    timers.advance_watermark(10_000, on_timer)
    assert fired == [(10, "a"), (20, "b"), (30, "c"), (5_000, "d")]
    assert timers.pending() == (0, 0)


def test_the_keyed_state_service_re_arms_from_the_return_too(tmp_path: Path) -> None:
    # the same callback contract for the stored timers (windows with allowed lateness)
    backend = window_backend(tmp_path, "timers")
    timers = InternalTimerService(backend)
    timers.open()
    backend.key_context.key = "a"
    timers.register_event_time_timer(10)
    fired: list[Any] = []

    def on_timer(ts: int, key: Any) -> int | None:
        fired.append((ts, key))
        return 50 if ts == 10 else None

    timers.advance_watermark(20, on_timer)
    assert fired == [(10, "a")]
    assert timers.pending() == (1, 0)
    timers.advance_watermark(100, on_timer)
    assert fired == [(10, "a"), (50, "a")]
    assert timers.pending() == (0, 0)
    backend.close()
