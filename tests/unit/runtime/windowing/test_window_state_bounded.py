"""Window bookkeeping holds what is live: a key's timers and window entries do not grow
with the records or sessions it had (the per-record cost follows from that)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiostream_ckpt.jobspec.graph import WindowKind, WindowSpec
from aiostream_ckpt.runtime.windowing.session_windows import SESSIONS, SessionWindowOperator
from aiostream_ckpt.runtime.windowing.window_operator import WindowOperator
from aiostream_ckpt.state.descriptors import MapStateDescriptor, ValueStateDescriptor
from aiostream_ckpt.state.lmdb import LmdbStateBackend
from aiostream_ckpt.time import CountAggregate, EventTimeSessionWindows, TumblingEventTimeWindows
from tests.unit.time.support import open_window_operator, window_backend


def _spec(assigner: Any, lateness: int) -> WindowSpec:
    return WindowSpec(
        assigner=assigner,
        kind=WindowKind.AGGREGATE,
        timestamp_assigner=lambda e: e["ts"],
        function=CountAggregate(),
        allowed_lateness=lateness,
    )


def _open_sessions(backend: LmdbStateBackend, lateness: int) -> SessionWindowOperator:
    spec = _spec(EventTimeSessionWindows.with_gap(1_000), lateness)
    op: SessionWindowOperator = open_window_operator(spec, lambda e: e["user"], backend)
    return op


def _tumbling(backend: LmdbStateBackend, lateness: int) -> WindowOperator:
    spec = _spec(TumblingEventTimeWindows.of(1_000), lateness)
    op: WindowOperator = open_window_operator(spec, lambda e: e["user"], backend)
    return op


def _session_operator(tmp: Path, lateness: int) -> tuple[Any, LmdbStateBackend]:
    backend = window_backend(tmp, "sessions")
    return _open_sessions(backend, lateness), backend


def test_growing_sessions_keep_one_window_and_its_timers(tmp_path: Path) -> None:
    for lateness in (0, 500):
        op, backend = _session_operator(tmp_path / f"l{lateness}", lateness)
        out: list[Any] = []
        ts = 0
        for _session in range(20):
            for _ in range(250):  # one session of 250 clicks, each extending its end
                out += op.process_batch([{"user": "u1", "ts": ts}, {"user": "u2", "ts": ts}])
                ts += 10
            # mid-session: each user has one window, and that window's timers only
            # (before: a timer per click at every old end, until the watermark passed)
            assert [len(op.open_sessions(u)) for u in ("u1", "u2")] == [1, 1]
            assert op.timer_service.pending() == (2 * (2 if lateness else 1), 0)
            ts += 5_000  # the session ends
            out += op.process_watermark(ts - 2_000)
        assert out == [250] * 40  # 20 sessions of each user, 250 clicks each, fired once
        assert op.open_sessions("u1") == op.open_sessions("u2") == []
        op.prepare_snapshot_pre_barrier(1)  # the held sessions go into keyed state
        assert list(backend.keys(SESSIONS)) == []
        assert backend.cached_entries("_timers.event") == 0
        assert op.timer_service.pending() == (0, 0)
        backend.close()


def test_merged_sessions_fire_once_at_their_own_end(tmp_path: Path) -> None:
    # grown and merged sessions keep their parts' timers; the first that fires
    # sets the session's own (its end moved), so it fires once, at its end
    for lateness in (0, 500):
        op, backend = _session_operator(tmp_path / f"l{lateness}", lateness)
        clicks = [0, 500, 2_400, 3_000, 1_500, 9_000]  # 1_500 bridges [0, 1500) and [2400, 4000)
        out: list[Any] = []
        for ts in clicks:
            out += op.process_batch([{"user": "u", "ts": ts}])
        assert op.open_sessions("u") == [(0, 4_000), (9_000, 10_000)]
        assert op.timer_service.pending()[0] <= 4 * (2 if lateness else 1)
        out += op.process_watermark(1_499)  # the first part's end: not the session's
        assert out == []
        out += op.process_watermark(3_999)
        assert out == [5]
        out += op.process_watermark(20_000)
        assert out == [5, 1]
        assert op.open_sessions("u") == []
        op.prepare_snapshot_pre_barrier(1)
        assert list(backend.keys(SESSIONS)) == []
        assert op.timer_service.pending() == (0, 0)
        backend.close()


def test_sessions_of_the_map_layout_are_moved_at_open(tmp_path: Path) -> None:
    # a checkpoint of the layout before: each session a ``window-contents`` map entry,
    # with its timer; opening the operator moves them, and they go on merging and firing
    backend = window_backend(tmp_path, "sessions")
    old = backend.create_state(MapStateDescriptor("window-contents"))
    old_timers = backend.create_state(MapStateDescriptor("_timers.event"))
    for key, window, count in (
        ("u", (0, 1_500), 2),
        ("u", (9_000, 10_000), 1),
        ("v", (0, 1_000), 4),
    ):
        backend.key_context.key = key
        old.put(window, count)
        old_timers.put(window[1] - 1, 0)
    op = _open_sessions(backend, lateness=0)
    assert op.open_sessions("u") == [(0, 1_500), (9_000, 10_000)]
    assert list(backend.keys("window-contents")) == []
    out = op.process_batch([{"user": "u", "ts": 1_200}, {"user": "u", "ts": 8_500}])
    out += op.process_watermark(20_000)
    # u: [0, 2200) holds 3, [8500, 10000) 2, each fired at its end from its parts' timers
    assert sorted(out) == [2, 3, 4]
    assert op.open_sessions("u") == op.open_sessions("v") == []
    backend.close()


def test_session_timers_are_derived_from_the_sessions_without_lateness(tmp_path: Path) -> None:
    # without allowed lateness the open sessions are the timers: none in keyed state
    # (before: a stored timer per session, a put and a remove per firing, LMDB records
    # at each checkpoint); a checkpoint that stored them has them cleared at open, and
    # its sessions fire at their ends all the same, once
    backend = window_backend(tmp_path, "sessions")
    stored = backend.create_state(ValueStateDescriptor(SESSIONS, list[tuple[int, int, Any]]))
    old_timers = backend.create_state(MapStateDescriptor("_timers.event"))
    for key, sessions, timers in (
        ("u", [(0, 1_500, 2), (9_000, 10_000, 1)], [999, 1_499, 9_999]),  # 999: a part's end
        ("v", [(500, 1_500, 4)], [1_499]),
    ):
        backend.key_context.key = key
        stored.update(sessions)
        for ts in timers:
            old_timers.put(ts, 0)
    op = _open_sessions(backend, lateness=0)
    assert list(backend.keys("_timers.event")) == []
    # a timer per key, at its earliest session's end: u's second session's is set when the
    # first fires
    assert op.timer_service.pending() == (2, 0)
    out = op.process_batch([{"user": "v", "ts": 1_000}])  # v's session grows to 2_000
    assert op.timer_service.pending() == (2, 0)
    out += op.process_watermark(1_499)
    assert out == [2]  # u's [0, 1500); v's timer at 1_499 re-armed at its end
    assert op.timer_service.pending() == (2, 0)  # u's at 9_999, v's at 1_999
    out += op.process_watermark(20_000)
    assert out == [2, 5, 1]
    assert op.timer_service.pending() == (0, 0)
    op.prepare_snapshot_pre_barrier(1)
    assert list(backend.keys(SESSIONS)) == []
    assert list(backend.keys("_timers.event")) == []
    backend.close()


def _stored_windows(tmp: Path, *, with_timers: bool) -> LmdbStateBackend:
    """A restored state of the window operator: u's [0, 1000) holds 2, [1000, 2000) 1; v's 4."""
    backend = window_backend(tmp, "windows")
    contents = backend.create_state(MapStateDescriptor("window-contents"))
    timers = backend.create_state(MapStateDescriptor("_timers.event"))
    stored = (("u", (0, 1_000), 2), ("u", (1_000, 2_000), 1), ("v", (0, 1_000), 4))
    for key, window, count in stored:
        backend.key_context.key = key
        contents.put(window, count)
        if with_timers:
            timers.put(window[1] - 1, 0)
    return backend


def test_window_timers_are_derived_from_the_windows_without_lateness(tmp_path: Path) -> None:
    # a checkpoint that stored a timer per window: cleared at open, the windows fire once
    backend = _stored_windows(tmp_path, with_timers=True)
    op = _tumbling(backend, lateness=0)
    assert list(backend.keys("_timers.event")) == []
    assert op.timer_service.pending() == (3, 0)
    out = op.process_batch([{"user": "u", "ts": 500}, {"user": "w", "ts": 1_200}])
    assert op.timer_service.pending() == (4, 0)  # w's new window; u's had its timer
    out += op.process_watermark(999)
    assert sorted(out) == [3, 4]
    out += op.process_watermark(5_000)
    assert sorted(out) == [1, 1, 3, 4]
    assert op.timer_service.pending() == (0, 0)
    assert list(backend.keys("window-contents")) == list(backend.keys("_timers.event")) == []
    backend.close()


def test_windows_stored_without_timers_get_them_with_lateness(tmp_path: Path) -> None:
    # an app restarted with allowed lateness from a checkpoint taken without it (no stored
    # timers): its windows get their end's and cleanup's timers, fire once, are cleaned up
    backend = _stored_windows(tmp_path, with_timers=False)
    op = _tumbling(backend, lateness=500)
    assert op.timer_service.pending() == (6, 0)
    out = op.process_watermark(999)
    assert sorted(out) == [2, 4]
    out += op.process_batch([{"user": "u", "ts": 600}])  # late firing: not late yet
    assert sorted(out) == [2, 3, 4]
    out += op.process_watermark(5_000)
    assert sorted(out) == [1, 2, 3, 4]
    assert list(backend.keys("window-contents")) == list(backend.keys("_timers.event")) == []
    backend.close()
