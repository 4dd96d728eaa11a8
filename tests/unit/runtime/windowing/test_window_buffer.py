"""Tumbling windows buffer their contents between barriers; a snapshot holds them.

The tumbling path keeps the windows changed since the last checkpoint in
memory and writes them to the map state in ``prepare_snapshot_pre_barrier``
(see ``aiostream_ckpt.runtime.windowing.window_operator``). These tests count the state
writes, and take snapshots at every step of a random stream (late and very
late records, late firings, a failing record; allowed lateness or not),
restore each into a new operator and check that the rest of the stream gives
what an uninterrupted run gives.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.jobspec.graph import WindowKind
from aiostream_ckpt.runtime.operators import RecordFailed
from aiostream_ckpt.runtime.windowing.window_base import MAX_HELD
from aiostream_ckpt.runtime.windowing.window_operator import WINDOW_CONTENTS
from aiostream_ckpt.state.backend import SnapshotTarget
from aiostream_ckpt.state.codecs import StateTypeError
from aiostream_ckpt.state.lmdb import LmdbStateBackend
from tests.unit.runtime.windowing.test_window_fast_paths import _operator, _run, _stream, _windows
from tests.unit.time.support import window_backend


class _CountingMap:
    """The operator's map state, counting puts and removes per stream key."""

    def __init__(self, inner: Any, backend: LmdbStateBackend) -> None:
        self._inner, self._kc = inner, backend.key_context
        self.puts: dict[Any, int] = {}
        self.removes: dict[Any, int] = {}

    def put(self, map_key: Any, value: Any) -> None:
        self.puts[self._kc.key] = self.puts.get(self._kc.key, 0) + 1
        self._inner.put(map_key, value)

    def remove(self, map_key: Any) -> None:
        self.removes[self._kc.key] = self.removes.get(self._kc.key, 0) + 1
        self._inner.remove(map_key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_state_is_written_once_per_barrier_and_never_for_a_window_fired_before_it(
    tmp_path: Path,
) -> None:
    # before: a put of the window per batch (50 for "a"), and for "b" 20 puts and a remove
    op = _operator(tmp_path, session=False, kind=WindowKind.AGGREGATE, lateness=0)
    counting = op._contents = _CountingMap(op._contents, op.backend)
    out = []
    for i in range(50):
        out += op.process_batch([{"k": "a", "ts": i, "v": 1}] * 10)
    assert counting.puts == {}
    op.prepare_snapshot_pre_barrier(1)
    assert counting.puts == {"a": 1}
    for i in range(20):
        out += op.process_batch([{"k": "a", "ts": 100 + i, "v": 1}, {"k": "b", "ts": i, "v": 1}])
    out += op.process_watermark(10_000)  # both windows [0, 500) fire
    assert sorted(out) == [20, 520]
    assert counting.puts == {"a": 1}  # "b" came and went between barriers
    assert counting.removes == {"a": 1}  # the written window is deleted, once
    op.prepare_snapshot_pre_barrier(2)
    assert counting.puts == {"a": 1}
    assert list(op.backend.keys(WINDOW_CONTENTS)) == []
    op.backend.close()


def _snapshot_restore(op: Any, tmp: Path, cid: int) -> LmdbStateBackend:
    """Snapshot ``op`` as a task does (hook, then the backend) into a new backend."""
    op.prepare_snapshot_pre_barrier(cid)
    root = tmp / f"cp{cid}"
    root.mkdir()
    target = SnapshotTarget(cid, root, root / "exclusive", root / "shared", is_savepoint=True)
    part = op.backend.snapshot(target)
    asyncio.run(part.prepare())
    handle = part.write()
    asyncio.run(part.settle())
    restored = window_backend(tmp / f"restored{cid}", op.backend.operator_uid)
    restored.restore(root, [handle])
    return restored


def _unordered(trace: list[Any]) -> list[Any]:
    """``trace`` with each firing's output sorted: timers restored from the windows
    fire a watermark's windows in key order, not in the order they opened."""
    return [
        (t[0], sorted(t[1], key=repr), *t[2:]) if t[0] in ("fired", "end") else t for t in trace
    ]


@pytest.mark.parametrize("kind", list(WindowKind))
@pytest.mark.parametrize("lateness", [0, 700])
def test_a_restore_from_any_barrier_fires_every_window_as_without_it(
    tmp_path: Path, kind: WindowKind, lateness: int
) -> None:
    steps = _stream(0)
    reference = _operator(tmp_path / "ref", session=False, kind=kind, lateness=lateness)
    want = _run(reference, steps)
    reference.backend.close()
    for at in range(0, len(steps), 7):
        tmp = tmp_path / f"at{at}"
        before = _operator(tmp, session=False, kind=kind, lateness=lateness)
        got = _run(before, steps[: at + 1], end=False)
        state_at_barrier = _windows(before)
        restored = _snapshot_restore(before, tmp, at + 1)
        before.backend.close()
        after = _operator(tmp, session=False, kind=kind, lateness=lateness, backend=restored)
        after.restore_watermark(steps[at][1])
        assert after._buffer == {}
        assert _windows(after) == state_at_barrier  # the buffered windows were in it
        got += _run(after, steps[at + 1 :])
        assert _unordered(got) == _unordered(want), at
        restored.close()


def test_windows_of_another_size_restored_take_the_general_path(tmp_path: Path) -> None:
    # the tumbling path finds a window from its end and its size: a savepoint taken with
    # 1000 ms windows restored with 500 ms ones would never fire [0, 1000) from its timer
    before = _operator(tmp_path, session=False, kind=WindowKind.AGGREGATE, lateness=0)
    before._tumbling = (1_000, 0)  # as an operator built with 1000 ms windows
    assert before.process_batch([{"k": "a", "ts": 700, "v": 3}]) == []
    restored = _snapshot_restore(before, tmp_path, 1)
    before.backend.close()
    after = _operator(
        tmp_path, session=False, kind=WindowKind.AGGREGATE, lateness=0, backend=restored
    )
    out = after.process_batch([{"k": "a", "ts": 800, "v": 1}])  # into [500, 1000) now
    assert sorted(out + after.process_watermark(1_000)) == [1, 3]
    assert list(restored.keys(WINDOW_CONTENTS)) == []
    restored.close()


def _run_with_end_batch(op: Any, steps: list[tuple[list[dict[str, Any]], int]]) -> list[Any]:
    """Feed ``steps`` as a task does with checkpoints off: ``end_batch`` after every
    batch and watermark, no barrier; the buffer never exceeds ``max_held`` after one."""
    trace: list[Any] = []
    for batch, watermark in steps:
        rest = batch
        while True:
            try:
                trace.append(("out", op.process_batch(rest)))
                break
            except RecordFailed as failed:
                trace.append(("failed", failed.index, failed.out))
                rest = rest[failed.index + 1 :]
        op.end_batch()
        assert len(op._buffer) <= op.max_held
        trace.append(("late", list(op.side_output)))
        op.side_output.clear()
        trace.append(("fired", sorted(op.process_watermark(watermark), key=repr)))
        op.end_batch()
        assert len(op._buffer) <= op.max_held
        trace.append(("windows", _windows(op)))
    trace.append(("end", sorted(op.process_watermark(1 << 40), key=repr), _windows(op)))
    return trace


def test_with_no_barrier_the_buffer_stays_within_the_state_cache_bound(tmp_path: Path) -> None:
    # 60 keys x 5 windows, all open, no barrier (checkpoints off). Before: the buffer held
    # all 300 windows until the watermark fired them; now a batch's end writes a buffer of
    # more than max_held (the state cache's 8 entries) into the map state.
    kind = WindowKind.PROCESS  # element lists: what a long window would hold in memory
    bounded = _operator(
        tmp_path, session=False, kind=kind, lateness=0, backend=window_backend(tmp_path, "b", 8)
    )
    unbounded = _operator(tmp_path, session=False, kind=kind, lateness=0)
    assert (bounded.max_held, unbounded.max_held) == (8, MAX_HELD)
    steps = [
        ([{"k": f"k{i % 60}", "ts": (i // 60) * 500 + r, "v": r} for r in range(3)], -1)
        for i in range(300)
    ]
    want = _run_with_end_batch(unbounded, steps)
    assert (
        len(unbounded._buffer) == 0 and max(len(w) for _, w in want[-2][1]) == 5
    )  # every key's 5 windows were open at once, in the buffer
    got = _run_with_end_batch(bounded, steps)
    assert got == want
    assert len(want[-1][1]) == 300  # every window fired once, at the end
    bounded.backend.close()
    unbounded.backend.close()


@pytest.mark.parametrize("kind", list(WindowKind))
@pytest.mark.parametrize("lateness", [0, 700])
def test_a_buffer_written_after_its_batch_gives_what_one_written_at_barriers_does(
    tmp_path: Path, kind: WindowKind, lateness: int
) -> None:
    # the random stream (late, very late, failing records) with the buffer written after
    # almost every batch (max_held 2) gives the same output, late records and windows
    steps = _stream(3)
    ref = _operator(tmp_path, session=False, kind=kind, lateness=lateness)
    small = window_backend(tmp_path, "small", cache_max_entries=2)
    op = _operator(tmp_path, session=False, kind=kind, lateness=lateness, backend=small)
    assert _run_with_end_batch(op, steps) == _run_with_end_batch(ref, steps)
    ref.backend.close()
    small.close()


@pytest.mark.parametrize("kind", list(WindowKind))
@pytest.mark.parametrize("session", [False, True], ids=["tumbling", "session"])
def test_contents_state_would_refuse_fail_at_the_record_not_at_the_flush(
    tmp_path: Path, kind: WindowKind, session: bool
) -> None:
    """Held contents reach keyed state only at the pre-barrier flush: a misfit failed there
    (at a checkpoint), and never when its window fired before a barrier, so whether the job
    failed followed checkpoint timing. Now refused as the record is folded, as the general
    path's put does (fails on the code before it: nothing raised here)."""
    op = _operator(tmp_path, session=session, kind=kind, lateness=0)
    # untyped contents: a NaN sum, a reduced record holding a tuple, an element with a tuple
    bad = {"k": "a", "ts": 1, "v": float("nan") if kind is WindowKind.AGGREGATE else 1}
    if kind is not WindowKind.AGGREGATE:
        bad["t"] = (1, 2)
    # the reduce function keeps k, ts and v: a bad record is seen as the first value only
    batch = [bad] if kind is WindowKind.REDUCE else [{"k": "a", "ts": 0, "v": 1}, bad]
    with pytest.raises((RecordFailed, StateTypeError)) as err:
        op.process_batch(batch)
    cause = err.value.__cause__ if isinstance(err.value, RecordFailed) else err.value
    assert isinstance(cause, StateTypeError)
    assert "window 'w'" in str(cause) and "for a window: " in str(cause)
    op.backend.close()
