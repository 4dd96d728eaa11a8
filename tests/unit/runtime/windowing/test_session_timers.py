"""Session windows' timers (``SessionTimers``): one per key, the earliest, fired as a heap would."""

from __future__ import annotations

import heapq
import itertools
import random
from typing import Any

import pytest

from aiostream_ckpt.runtime.windowing.session_timers import SessionTimers
from aiostream_ckpt.state.backend import KeyContext
from tests.unit.time.test_derived_timers import _Backend, _drive


class _HeapTimers:
    """The reference: a heap of ``(timestamp, sequence, key)`` and each key's earliest time."""

    def __init__(self, kc: KeyContext) -> None:
        self._kc, self._heap, self._armed = kc, [], {}
        self._seq = itertools.count()

    def register_event_time_timer(self, timestamp: int) -> None:
        key = self._kc.key
        if key not in self._armed or timestamp < self._armed[key]:
            self._armed[key] = timestamp
            heapq.heappush(self._heap, (timestamp, next(self._seq), key))

    def advance_watermark(self, watermark: int, on_timer: Any, held: Any = None) -> None:
        while self._heap and self._heap[0][0] <= watermark:
            ts, _, key = heapq.heappop(self._heap)
            if self._armed.get(key) != ts:
                continue
            del self._armed[key]
            self._kc.key = key
            later = on_timer(ts, key)
            if later is not None:
                self.register_event_time_timer(later)

    def pending(self) -> tuple[int, int]:
        return len(self._armed), 0


@pytest.mark.parametrize("seed", range(8))
def test_fires_each_keys_earliest_timer_as_a_heap_would(seed: int) -> None:
    backend, want_kc = _Backend(), KeyContext()
    got = SessionTimers(backend)  # type: ignore[arg-type]
    want = _HeapTimers(want_kc)
    assert _drive(got, backend.key_context, seed) == _drive(want, want_kc, seed)
    assert got.pending() == (0, 0)


def _sessions_run(timers: Any, kc: KeyContext, seed: int, *, pass_held: bool) -> list[Any]:
    """Sessions that grow past their timers: the callback re-arms or fires, as the operator's."""
    rng = random.Random(seed)
    held: dict[str, list[list[int]]] = {}
    fired: list[Any] = []

    def on_timer(ts: int, key: Any) -> int | None:
        sessions = held.get(key, [])
        if len(sessions) == 1 and sessions[0][1] - 1 > ts:
            return sessions[0][1] - 1  # set before the session grew
        fired.append((ts, key, [s[:] for s in sessions]))
        keep = [s for s in sessions if s[1] - 1 != ts]
        held[key] = keep
        for s in keep:
            timers.register_event_time_timer(s[1] - 1)
        return None

    now = 0
    for _ in range(400):
        for _ in range(rng.randint(0, 8)):
            key = rng.choice("abcdef")
            ts = now + rng.randint(-300, 0)
            kc.key = key
            sessions = held.setdefault(key, [])
            hit = [s for s in sessions if s[0] <= ts + 1_000 and ts <= s[1]]
            if hit:  # grows in place, as a held session does: its timer stays
                hit[0][1] = max(hit[0][1], ts + 1_000)
            else:  # a new session (sometimes a key's second)
                sessions.append([ts, ts + 1_000])
                timers.register_event_time_timer(ts + 999)
        now += rng.randint(0, 400)
        timers.advance_watermark(now - 400, on_timer, *((held,) if pass_held else ()))
    timers.advance_watermark(1 << 40, on_timer, *((held,) if pass_held else ()))
    return fired


@pytest.mark.parametrize("seed", range(6))
def test_a_held_sessions_early_timer_is_re_armed_as_the_callback_would(seed: int) -> None:
    # the loop re-arms a key's one held session at its end itself (no callback): the same
    # firings, in the same order, as the callback's re-arm and as a heap's
    runs = []
    for timers_class, pass_held in ((SessionTimers, True), (SessionTimers, False), (None, False)):
        backend = _Backend()
        kc = backend.key_context
        timers = _HeapTimers(kc) if timers_class is None else timers_class(backend)  # type: ignore[arg-type]
        runs.append(_sessions_run(timers, kc, seed, pass_held=pass_held))
        assert timers.pending() == (0, 0)
    assert runs[0] == runs[1] == runs[2]
    assert len(runs[0]) > 50


def test_timers_after_one_that_raised_stay_pending() -> None:
    backend = _Backend()
    timers = SessionTimers(backend)  # type: ignore[arg-type]
    kc = backend.key_context
    for key, ts in (("a", 10), ("b", 20), ("c", 30), ("d", 5_000)):
        kc.key = key
        timers.register_event_time_timer(ts)
    kc.key = "c"
    timers.register_event_time_timer(25)  # c's earlier one: its 30 is left behind
    fired: list[Any] = []

    def on_timer(ts: int, key: Any) -> None:
        fired.append((ts, key))
        if key == "b" and fired.count((ts, key)) == 1:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        timers.advance_watermark(100, on_timer)
    assert fired == [(10, "a"), (20, "b")]
    assert timers.pending() == (2, 0)  # b fired (as a heap pops it first); c and d wait
    timers.advance_watermark(10_000, on_timer)
    assert fired == [(10, "a"), (20, "b"), (25, "c"), (5_000, "d")]
    assert timers.pending() == (0, 0)


def test_a_later_time_for_a_key_with_a_timer_is_a_no_op() -> None:
    backend = _Backend()
    timers = SessionTimers(backend)  # type: ignore[arg-type]
    backend.key_context.key = "u"
    timers.register_event_time_timer(500)
    timers.register_event_time_timer(900)  # its session's end: set when 500 fires
    assert timers.has_event_time_timer(500) and not timers.has_event_time_timer(900)
    fired: list[int] = []
    timers.advance_watermark(10_000, lambda ts, key: fired.append(ts))
    assert fired == [500]
