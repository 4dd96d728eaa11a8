"""A stored process window is appended to: a record's cost does not follow its window's length.

Past the held bound (or at each barrier) the tumbling path writes its buffer
to keyed state; a process window already there gets the elements buffered
since as a chunk (``WINDOW_APPENDS``, folded with the newest chunks: see
test_window_chunks), read once when the window fires. These tests count the
elements written to and read from keyed state, compare the output with an
unbounded operator's, and restore the appended layout: as is, under another
window size (folded into one list for the general path), with fired windows
dropped at open, and from a checkpoint of the one-list layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.jobspec.graph import WindowKind
from aiostream_ckpt.runtime.windowing.window_operator import WINDOW_APPENDS, WINDOW_CONTENTS
from aiostream_ckpt.state.descriptors import MapStateDescriptor
from tests.unit.runtime.windowing.test_window_buffer import _snapshot_restore
from tests.unit.runtime.windowing.test_window_fast_paths import _operator, _windows
from tests.unit.time.support import window_backend

KEYS, ROUNDS = 20, 40


class _CountingElements:
    """A window map state, counting the elements of the lists put into it and read from it."""

    def __init__(self, inner: Any, counts: dict[str, int]) -> None:
        self._inner, self._counts = inner, counts

    def put(self, map_key: Any, value: Any) -> None:
        self._counts["written"] += len(value)
        self._inner.put(map_key, value)

    def put_unread(self, map_key: Any, value: Any) -> None:
        self._counts["written"] += len(value)
        self._inner.put_unread(map_key, value)

    def get(self, map_key: Any, default: Any = None) -> Any:
        return self._read(self._inner.get(map_key, default))

    def get_unread(self, map_key: Any, default: Any = None) -> Any:
        return self._read(self._inner.get_unread(map_key, default))

    def _read(self, value: Any) -> Any:
        if isinstance(value, list):
            self._counts["read"] += len(value)
        return value

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _count(op: Any) -> dict[str, int]:
    counts = {"written": 0, "read": 0}
    op._contents = _CountingElements(op._contents, counts)
    if getattr(op, "_appends", None) is not None:
        op._appends = _CountingElements(op._appends, counts)
    return counts


def _round(r: int) -> list[dict[str, Any]]:
    """One record per key, all into each key's window [0, 500)."""
    return [{"k": f"k{i}", "ts": r % 500, "v": r} for i in range(KEYS)]


@pytest.mark.parametrize("written_at", ["held bound", "barrier"])
def test_a_stored_window_is_appended_to_and_read_once_when_it_fires(
    tmp_path: Path, written_at: str
) -> None:
    # 20 keys, one open process window each, written after every round of one record per
    # key: past the held bound (a state cache of 8: no barrier), or at a barrier per round.
    # Before appending: each round read every window's whole list back and wrote it again
    # (round r: 20 lists of r elements written, of r - 1 read: 16,400 written over 40
    # rounds). Appended: 20 new elements per round, folded with the newest chunks as a
    # binary counter (test_window_chunks): 40 rounds write 132 elements a window (each
    # element ~3.3 times, at most 1 + log5/3(40)), reading back what they fold, at most
    # 5 chunks a window; when the windows fire each element is read once.
    cache = 8 if written_at == "held bound" else 1_000_000
    op = _operator(
        tmp_path,
        session=False,
        kind=WindowKind.PROCESS,
        lateness=0,
        backend=window_backend(tmp_path, "b", cache),
    )
    unbounded = _operator(tmp_path, session=False, kind=WindowKind.PROCESS, lateness=0)
    counts = _count(op)
    for r in range(ROUNDS):
        assert op.process_batch(_round(r)) == unbounded.process_batch(_round(r)) == []
        if written_at == "barrier":
            op.prepare_snapshot_pre_barrier(r + 1)
        op.end_batch()
        assert op._buffer == {}  # every round's window went into state
        assert all(n <= 4 for n in op._stored.values())  # chunks past the list
    assert counts == {"written": KEYS * 132, "read": KEYS * (132 - ROUNDS)}
    counts.update(written=0, read=0)
    assert _windows(op) == _windows(unbounded)
    fired = op.process_watermark(499)
    assert sorted(fired) == sorted(unbounded.process_watermark(499))
    assert sorted(fired) == sorted((f"k{i}", 0, 500, list(range(ROUNDS))) for i in range(KEYS))
    assert counts == {"written": 0, "read": KEYS * ROUNDS}
    op.end_batch()
    assert list(op.backend.keys(WINDOW_CONTENTS)) == list(op.backend.keys(WINDOW_APPENDS)) == []
    op.backend.close()
    unbounded.backend.close()


def _appended(tmp: Path, lateness: int = 0) -> Any:
    """An operator whose keys a, b and c have a window [0, 500): a list of 4 and chunks of 2, 1.

    Written in rounds of 4, 2 and 1 records a key (values 0-3, 4-5, 6): each
    smaller than 2/3 of the one before, so none is folded into another.
    """
    op = _operator(
        tmp,
        session=False,
        kind=WindowKind.PROCESS,
        lateness=lateness,
        backend=window_backend(tmp, "w", 2),
    )
    for values in ([0, 1, 2, 3], [4, 5], [6]):
        op.process_batch([{"k": k, "ts": 50 * v, "v": v} for v in values for k in "abc"])
        op.end_batch()  # 3 windows > max_held 2: written, then appended to
    assert op._stored == {("a", 0): 2, ("b", 0): 2, ("c", 0): 2}
    return op


def test_appended_windows_restore_as_they_were_and_fire_once(tmp_path: Path) -> None:
    op = _appended(tmp_path)
    op.process_batch([{"k": "a", "ts": 400, "v": 7}])  # buffered, in no chunk yet
    held = _windows(op)
    restored = _snapshot_restore(op, tmp_path, 1)
    op.backend.close()
    after = _operator(
        tmp_path, session=False, kind=WindowKind.PROCESS, lateness=0, backend=restored
    )
    # a's element, flushed for the snapshot, folded its chunks into its list (4, 2, 1, 1)
    assert after._stored == {("a", 0): 0, ("b", 0): 2, ("c", 0): 2}
    assert _windows(after) == held
    assert sorted(after.process_watermark(499)) == [
        ("a", 0, 500, [0, 1, 2, 3, 4, 5, 6, 7]),
        ("b", 0, 500, [0, 1, 2, 3, 4, 5, 6]),
        ("c", 0, 500, [0, 1, 2, 3, 4, 5, 6]),
    ]
    assert list(restored.keys(WINDOW_APPENDS)) == []
    restored.close()


def test_appended_windows_restored_with_another_size_are_one_list_again(tmp_path: Path) -> None:
    # the general path reads a window as one list: the chunks are folded into it at open
    op = _appended(tmp_path)
    restored = _snapshot_restore(op, tmp_path, 1)
    op.backend.close()
    after = _operator(
        tmp_path, session=False, kind=WindowKind.PROCESS, lateness=0, backend=restored
    )
    after._tumbling = None  # as an operator built with windows of another size
    after._index_stored()
    assert list(restored.keys(WINDOW_APPENDS)) == []
    out = after.process_batch([{"k": "a", "ts": 450, "v": 9}])
    assert sorted(out + after.process_watermark(499)) == [
        ("a", 0, 500, [0, 1, 2, 3, 4, 5, 6, 9]),
        ("b", 0, 500, [0, 1, 2, 3, 4, 5, 6]),
        ("c", 0, 500, [0, 1, 2, 3, 4, 5, 6]),
    ]
    restored.close()


def test_fired_windows_restored_without_lateness_are_dropped_with_their_chunks(
    tmp_path: Path,
) -> None:
    op = _appended(tmp_path, lateness=10_000)
    op.process_batch([{"k": "a", "ts": 700, "v": 5}])
    assert len(op.process_watermark(600)) == 3  # [0, 500) fired, kept for late records
    restored = _snapshot_restore(op, tmp_path, 1)
    op.backend.close()
    after = _operator(
        tmp_path, session=False, kind=WindowKind.PROCESS, lateness=0, backend=restored
    )
    assert after._stored == {("a", 500): 0}
    assert list(restored.keys(WINDOW_APPENDS)) == []
    assert after.process_watermark(999) == [("a", 500, 1000, [5])]
    restored.close()


def test_a_checkpoint_of_the_one_list_layout_restores_and_is_appended_to(tmp_path: Path) -> None:
    # written as before the appended layout: each window one list, no WINDOW_APPENDS
    old = window_backend(tmp_path / "old", "w")
    contents = old.create_state(MapStateDescriptor(WINDOW_CONTENTS))
    for k in "ab":
        old.key_context.key = k
        contents.put((0, 500), [{"k": k, "ts": t, "v": t} for t in range(3)])
    restored = _snapshot_restore(_NothingHeld(old), tmp_path, 1)
    old.close()
    op = _operator(tmp_path, session=False, kind=WindowKind.PROCESS, lateness=0, backend=restored)
    op.max_held = 1
    assert op._stored == {("a", 0): 0, ("b", 0): 0}
    op.process_batch([{"k": k, "ts": 7, "v": 7} for k in "ab"])
    op.end_batch()  # 2 > max_held: appended, the lists untouched
    assert op._stored == {("a", 0): 1, ("b", 0): 1}
    assert sorted(op.process_watermark(499)) == [
        ("a", 0, 500, [0, 1, 2, 7]),
        ("b", 0, 500, [0, 1, 2, 7]),
    ]
    restored.close()


class _NothingHeld:
    """A bare backend, snapshotted as ``_snapshot_restore`` snapshots an operator's."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        pass
