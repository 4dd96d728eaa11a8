"""Session windows hold their keys' sessions between barriers and write them at the barrier.

Keyed-state work is per key and barrier, not per record or batch, and does not
grow with a key's history; the snapshot at a barrier holds the sessions as of
that barrier (later records, merges and firings stay out of it), and a restore
from it goes on as the run without a failure would.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.jobspec.graph import WindowKind, WindowSpec
from aiostream_ckpt.jobspec.window_functions import ProcessWindowFunction
from aiostream_ckpt.runtime.windowing.session_timers import SessionTimers
from aiostream_ckpt.runtime.windowing.session_windows import SessionWindowOperator
from aiostream_ckpt.state.backend import SnapshotTarget
from aiostream_ckpt.time import CountAggregate, EventTimeSessionWindows
from tests.unit.time.support import open_window_operator, window_backend


class _Counting:
    """The operator's sessions state, counting reads and writes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads = self.writes = 0

    def value(self) -> Any:
        self.reads += 1
        return self.inner.value()

    def update(self, value: Any) -> None:
        self.writes += 1
        self.inner.update(value)

    def update_unchanged(self, value: Any) -> None:
        self.writes += 1
        self.inner.update_unchanged(value)

    def update_all_unchanged(self, values: dict[Any, Any]) -> None:
        self.writes += len(values)
        self.inner.update_all_unchanged(values)


class _Elements(ProcessWindowFunction[Any, Any, Any]):
    def process(self, key: Any, context: Any, elements: Any, out: Any) -> None:
        w = context.window
        out.collect((key, w.start, w.end, sorted(e["ts"] for e in elements)))


def _operator(backend: Any, kind: WindowKind, lateness: int = 0) -> SessionWindowOperator:
    spec = WindowSpec(
        assigner=EventTimeSessionWindows.with_gap(1_000),
        kind=kind,
        timestamp_assigner=lambda e: e["ts"],
        function=CountAggregate() if kind is WindowKind.AGGREGATE else _Elements(),
        allowed_lateness=lateness,
    )
    op: SessionWindowOperator = open_window_operator(spec, lambda e: e["user"], backend)
    return op


@pytest.mark.parametrize("lateness", [0, 500])
def test_state_work_is_per_key_and_barrier_whatever_the_history(
    tmp_path: Path, lateness: int
) -> None:
    # 3 users, 1000 sessions each, each session 20 batches of one click per user and
    # a barrier. Before: a state read and write per key and batch (60 + 60 per session).
    backend = window_backend(tmp_path, "sessions")
    op = _operator(backend, WindowKind.AGGREGATE, lateness)
    state = op._sessions = _Counting(op._sessions)  # type: ignore[assignment]
    users = ("a", "b", "c")
    per_session = []
    out: list[Any] = []
    ts = timers = 0
    for session in range(1_000):
        reads, writes = state.reads, state.writes
        for _ in range(20):
            out += op.process_batch([{"user": u, "ts": ts} for u in users])
            op.end_batch()
            ts += 100
        between = (state.reads - reads, state.writes - writes)
        op.prepare_snapshot_pre_barrier(session + 1)
        at_barrier = state.writes - writes - between[1]
        ts += 5_000  # the sessions end and fire
        out += op.process_watermark(ts - 2_000)
        op.end_batch()
        per_session.append((between, at_barrier, state.reads - reads, state.writes - writes))
        timers = max(timers, op.timer_service.pending()[0])
    assert out == [20] * 3_000
    first, second, last = per_session[0], per_session[1], per_session[-1]
    assert first[:2] == ((3, 0), 3)  # a read per key (none stored yet), a write at the barrier
    assert second == last  # the 1000th session costs what the 2nd did
    assert last[:2] == ((0, 0), 3)  # held since their last sessions fired
    # a timer of a key not held reads its sessions: one set before the session grew, its
    # end's, its cleanup's (with lateness); none per click
    assert last[2] <= (4 if lateness else 2) * len(users)
    assert timers <= 2 * len(users)  # memory: what is live, not what was
    assert op.held_keys() == len(users)  # the last firings' (empty) lists, until a barrier
    backend.close()


def _target(root: Path, cid: int) -> SnapshotTarget:
    return SnapshotTarget(cid, root, root / f"chk-{cid}", root / "shared")


def _finish(part: Any) -> Any:
    asyncio.run(part.prepare())
    handle = part.write()
    asyncio.run(part.settle())
    return handle


def _clicks(*pairs: tuple[str, int]) -> list[dict[str, Any]]:
    return [{"user": u, "ts": ts} for u, ts in pairs]


@pytest.mark.parametrize("kind", [WindowKind.AGGREGATE, WindowKind.PROCESS])
def test_the_snapshot_holds_the_sessions_of_its_barrier_and_merges_go_on_after_restore(
    tmp_path: Path, kind: WindowKind
) -> None:
    root = tmp_path / "checkpoints"
    backend = window_backend(tmp_path / "a", "sessions")
    op = _operator(backend, kind)
    # u: [0, 1000) and [1500, 2500); v: [0, 1100); w: [100, 1100), due at the next watermark
    op.process_batch(_clicks(("u", 0), ("u", 1_500), ("v", 0), ("v", 100), ("w", 100)))
    op.end_batch()
    op.prepare_snapshot_pre_barrier(1)
    part = backend.snapshot(_target(root, 1))
    # after the barrier, before its asynchronous part: u's click at 900 merges both of
    # its sessions, v's grows (a PROCESS session's element list grows in place), w fires
    after = _clicks(("u", 900), ("v", 200), ("x", 0))
    out = op.process_batch(after)
    op.end_batch()
    out += op.process_watermark(1_099)
    handle = _finish(part)
    out += op.process_watermark(1 << 40)

    restored_backend = window_backend(tmp_path / "b", "sessions")
    restored_backend.restore(root, [handle])
    restored = _operator(restored_backend, kind)
    assert [restored.open_sessions(k) for k in ("u", "v", "w", "x")] == [
        [(0, 1_000), (1_500, 2_500)],
        [(0, 1_100)],
        [(100, 1_100)],
        [],
    ]
    again = restored.process_batch(after)
    restored.end_batch()
    again += restored.process_watermark(1_099)
    again += restored.process_watermark(1 << 40)
    assert sorted(again) == sorted(out)
    if kind is WindowKind.AGGREGATE:
        assert sorted(out) == [1, 1, 3, 3]  # w, x; u, v
    else:
        assert sorted(out) == [
            ("u", 0, 2_500, [0, 900, 1_500]),
            ("v", 0, 1_200, [0, 100, 200]),
            ("w", 100, 1_100, [100]),
            ("x", 0, 1_000, [0]),
        ]
    backend.close()
    restored_backend.close()


def test_more_held_keys_than_the_bound_are_flushed_after_their_batch(tmp_path: Path) -> None:
    backend = window_backend(tmp_path, "sessions")
    op = _operator(backend, WindowKind.AGGREGATE)
    op.max_held = 10
    op.process_batch(_clicks(*((f"k{i}", i) for i in range(11))))
    assert op.held_keys() == 11
    op.end_batch()
    assert op.held_keys() == 0
    assert len(list(backend.keys("session-windows"))) == 11
    assert op.open_sessions("k3") == [(3, 1_003)]
    backend.close()


def test_the_flush_leaves_the_key_context_as_it_found_it(tmp_path: Path) -> None:
    backend = window_backend(tmp_path, "sessions")
    op = _operator(backend, WindowKind.AGGREGATE)
    op.process_batch(_clicks(("a", 0), ("b", 0)))
    backend.key_context.key = "z"
    op.prepare_snapshot_pre_barrier(1)
    assert backend.key_context.key == "z"
    assert op.held_keys() == 0
    backend.close()


def test_a_growing_session_registers_one_timer_not_one_per_early_fire(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One user clicks every 300 ms for 30 s (gap 1 s): the session's timer fires early
    # about 30 times (the watermark passes its end, the session has grown since). Before:
    # each early fire registered the timer again (31 registrations); now the timer loop
    # re-arms it from the callback's return, and the session registers one.
    registered: list[int] = []
    register = SessionTimers.register_event_time_timer

    def counting(self: SessionTimers, timestamp: int) -> None:
        registered.append(timestamp)
        register(self, timestamp)

    monkeypatch.setattr(SessionTimers, "register_event_time_timer", counting)
    backend = window_backend(tmp_path, "sessions")
    op = _operator(backend, WindowKind.AGGREGATE)
    out: list[Any] = []
    for ts in range(0, 30_000, 300):
        out += op.process_batch(_clicks(("a", ts)))
        out += op.process_watermark(ts - 100)
    out += op.process_watermark(30_000)  # the last early fire: re-armed at 30 699
    out += op.process_watermark(1 << 40)
    assert out == [100]  # one session, every click in it
    assert op.open_sessions("a") == []
    assert registered == [999]  # its first click's end; the ~30 early fires re-armed
    assert op.timer_service.pending() == (0, 0)
    backend.close()


def test_the_held_keys_bound_follows_the_state_cache_size(tmp_path: Path) -> None:
    # before: 50,000 held keys whatever state.cache_max_entries said; now a cache of 5
    # entries bounds the held dict to 5 keys after a batch (the 6 are in keyed state)
    backend = window_backend(tmp_path, "sessions", cache_max_entries=5)
    op = _operator(backend, WindowKind.AGGREGATE)
    assert op.max_held == 5
    op.process_batch(_clicks(*((f"k{i}", i) for i in range(6))))
    op.end_batch()
    assert op.held_keys() == 0
    assert len(list(backend.keys("session-windows"))) == 6
    assert sorted(op.process_watermark(1 << 40)) == [1] * 6
    backend.close()


def test_the_barrier_writes_the_held_keys_in_one_call_and_they_read_back(
    tmp_path: Path,
) -> None:
    # Before: a key switch and an update_unchanged call per held key (10 k per barrier on
    # the bench); now one update_all_unchanged for all of them, a fired key's cleared
    backend = window_backend(tmp_path, "sessions")
    op = _operator(backend, WindowKind.AGGREGATE)
    state = op._sessions = _Counting(op._sessions)  # type: ignore[assignment]
    calls: list[int] = []
    bulk = state.update_all_unchanged

    def counting(values: dict[Any, Any]) -> None:
        calls.append(len(values))
        bulk(values)

    state.update_all_unchanged = counting  # type: ignore[method-assign]
    out = op.process_batch(_clicks(*((f"k{i}", i) for i in range(100)), ("gone", 0)))
    out += op.process_watermark(1_050)  # gone and k0..k51 fire: their lists are empty
    out += op.process_batch(_clicks(("k99", 1_000)))  # grows after the firings
    backend.key_context.key = "z"
    op.prepare_snapshot_pre_barrier(1)
    assert calls == [101] and state.writes == 101
    assert backend.key_context.key == "z"
    assert out == [1] * 53
    assert op.open_sessions("gone") == [] and op.open_sessions("k0") == []
    assert op.open_sessions("k99") == [(99, 2_000)]
    assert sorted(backend.keys("session-windows")) == sorted(f"k{i}" for i in range(52, 100))
    backend.close()
