"""Tumbling windows buffer their contents between barriers; a snapshot holds them.

The tumbling path keeps the windows changed since the last checkpoint in
memory and writes them to the map state in ``prepare_snapshot_pre_barrier``
(see ``aiostream_ckpt.runtime.window_operator``). These tests count the state
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
from aiostream_ckpt.runtime.window_operator import WINDOW_CONTENTS
from aiostream_ckpt.state.backend import SnapshotTarget
from aiostream_ckpt.state.lmdb import LmdbStateBackend
from tests.unit.time.support import window_backend
from tests.unit.time.test_window_fast_paths import _operator, _run, _stream, _windows


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
