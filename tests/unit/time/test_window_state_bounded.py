"""Window bookkeeping holds what is live: a key's timers and window entries do not grow
with the records or sessions it had (the per-record cost follows from that)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiostream_ckpt.api.functions import RuntimeContext
from aiostream_ckpt.jobspec.graph import WindowKind, WindowSpec
from aiostream_ckpt.runtime.session_windows import SESSIONS, SessionWindowOperator
from aiostream_ckpt.state.descriptors import MapStateDescriptor
from aiostream_ckpt.state.keygroups import KeyGroupRange
from aiostream_ckpt.state.lmdb import LmdbStateBackend
from aiostream_ckpt.time import CountAggregate, EventTimeSessionWindows

MAXP = 128


def _session_operator(tmp: Path, lateness: int) -> tuple[Any, LmdbStateBackend]:
    spec = WindowSpec(
        assigner=EventTimeSessionWindows.with_gap(1_000),
        kind=WindowKind.AGGREGATE,
        timestamp_assigner=lambda e: e["ts"],
        function=CountAggregate(),
        allowed_lateness=lateness,
    )
    op = SessionWindowOperator("sessions", spec, lambda e: e["user"])
    backend = LmdbStateBackend(
        operator_uid="sessions",
        subtask_index=0,
        key_group_range=KeyGroupRange(0, MAXP - 1),
        max_parallelism=MAXP,
        local_dir=tmp,
    )
    op.backend = backend
    op.open(
        RuntimeContext(
            operator_uid="sessions", subtask_index=0, parallelism=1, params={}, backend=backend
        )
    )
    return op, backend


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
        assert list(backend.keys(SESSIONS)) == []
        assert op.timer_service.pending() == (0, 0)
        backend.close()


def test_sessions_of_the_map_layout_are_moved_at_open(tmp_path: Path) -> None:
    # a checkpoint of the layout before: each session a ``window-contents`` map entry,
    # with its timer; opening the operator moves them, and they go on merging and firing
    backend = LmdbStateBackend(
        operator_uid="sessions",
        subtask_index=0,
        key_group_range=KeyGroupRange(0, MAXP - 1),
        max_parallelism=MAXP,
        local_dir=tmp_path,
    )
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
    spec = WindowSpec(
        assigner=EventTimeSessionWindows.with_gap(1_000),
        kind=WindowKind.AGGREGATE,
        timestamp_assigner=lambda e: e["ts"],
        function=CountAggregate(),
    )
    op = SessionWindowOperator("sessions", spec, lambda e: e["user"])
    op.backend = backend
    op.open(
        RuntimeContext(
            operator_uid="sessions", subtask_index=0, parallelism=1, params={}, backend=backend
        )
    )
    assert op.open_sessions("u") == [(0, 1_500), (9_000, 10_000)]
    assert list(backend.keys("window-contents")) == []
    out = op.process_batch([{"user": "u", "ts": 1_200}, {"user": "u", "ts": 8_500}])
    out += op.process_watermark(20_000)
    # u: [0, 2200) holds 3, [8500, 10000) 2, each fired at its end from its parts' timers
    assert sorted(out) == [2, 3, 4]
    assert op.open_sessions("u") == op.open_sessions("v") == []
    backend.close()
