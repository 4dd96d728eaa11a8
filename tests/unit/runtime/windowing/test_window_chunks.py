"""A stored process window's appended chunks stay few: folded as a log-structured merge.

A window written once per record (one record between barriers, or past the
held bound) got a chunk, an LMDB entry, per write. Now a new chunk takes in
the newest ones while the one before is at most 1.5 times its size, so a
window of n elements keeps at most log1.5(n) + 1 chunks and each element is
written O(log n) times. These tests count chunks and the elements written,
compare the output with an unbounded operator's, and restore mid-window from
a checkpoint holding several chunks (and from one of a chunk per write).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from aiostream_ckpt.jobspec.graph import WindowKind, WindowSpec
from aiostream_ckpt.runtime.windowing.window_operator import WINDOW_APPENDS
from aiostream_ckpt.state.descriptors import MapStateDescriptor
from aiostream_ckpt.time import SlidingEventTimeWindows
from tests.unit.runtime.windowing.test_window_appends import _count, _NothingHeld
from tests.unit.runtime.windowing.test_window_buffer import _snapshot_restore
from tests.unit.runtime.windowing.test_window_fast_paths import CountElements, _operator, _windows
from tests.unit.time.support import open_window_operator, window_backend


def _process(tmp: Path, backend: Any = None) -> Any:
    return _operator(tmp, session=False, kind=WindowKind.PROCESS, lateness=0, backend=backend)


def _record(v: int) -> list[dict[str, Any]]:
    return [{"k": "a", "ts": v % 500, "v": v}]


def _chunks(op: Any) -> int:
    """The stored chunks of key ``a``'s window [0, 500) (its list not counted)."""
    op.backend.key_context.key = "a"
    return len([k for k, _ in op._appends.items() if k[:2] == (0, 500)])


def _bound(n: int) -> float:
    """At most log1.5(n) + 1 entries for n elements: each chunk > 1.5 times the next."""
    return math.log(n, 1.5) + 1


def _write_one_at_a_time(op: Any, reference: Any, values: range) -> None:
    """Each value a record of its own, written to state at a barrier before the next."""
    for v in values:
        assert op.process_batch(_record(v)) == reference.process_batch(_record(v)) == []
        op.prepare_snapshot_pre_barrier(v + 1)
        op.end_batch()
        assert op._buffer == {}
        assert _chunks(op) + 1 <= _bound(v + 1), v  # a chunk per write: fails at v = 4


def test_one_record_writes_keep_a_window_to_few_chunks_and_its_output(tmp_path: Path) -> None:
    # 300 one-record writes to one window: a chunk per write was 299 LMDB entries; now at
    # most log1.5(300) + 1 = 15, each element written at most 1 + log5/3(300) ~ 12 times
    # (a binary counter: ~5) and read back as often before the firing.
    n = 300
    op = _process(tmp_path, window_backend(tmp_path, "b"))
    reference = _process(tmp_path / "ref")
    counts = _count(op)
    _write_one_at_a_time(op, reference, range(n))
    assert counts["written"] <= n * (1 + math.log(n, 5 / 3))
    assert counts["written"] < 6 * n  # measured 5.1 n; 14e8f19: n, each its own entry
    assert _windows(op) == _windows(reference)
    counts.update(written=0, read=0)
    fired = op.process_watermark(499)
    assert fired == reference.process_watermark(499) == [("a", 0, 500, list(range(n)))]
    assert counts == {"written": 0, "read": n}  # each element read once when it fires
    op.end_batch()
    assert list(op.backend.keys(WINDOW_APPENDS)) == []
    op.backend.close()
    reference.backend.close()


def test_a_restore_mid_window_from_several_chunks_keeps_folding_and_fires_once(
    tmp_path: Path,
) -> None:
    # 22 one-record writes and a 23rd buffered at the barrier: the list (16 elements) and
    # chunks of 4, 2 and 1 at the checkpoint; the restored operator reads their sizes at its
    # first append and goes on folding as the one that was never restored: same output.
    op = _process(tmp_path, window_backend(tmp_path, "b"))
    reference = _process(tmp_path / "ref")
    _write_one_at_a_time(op, reference, range(22))
    assert op._chunk_sizes == {("a", 0): [16, 4, 2]}
    op.process_batch(_record(22))  # buffered: written by the snapshot's flush
    reference.process_batch(_record(22))
    restored = _snapshot_restore(op, tmp_path, 1)
    after = _process(tmp_path, restored)
    assert op._chunk_sizes == {("a", 0): [16, 4, 2, 1]}
    assert after._stored == {("a", 0): 3} and after._chunk_sizes == {}
    assert _windows(after) == _windows(op)
    op.backend.close()
    _write_one_at_a_time(after, reference, range(23, 80))
    assert after._chunk_sizes == {("a", 0): [64, 16]}  # 80 elements, as a binary counter
    assert _chunks(after) == 1
    assert after.process_watermark(499) == reference.process_watermark(499)
    assert list(restored.keys(WINDOW_APPENDS)) == []
    restored.close()
    reference.backend.close()


def test_a_checkpoint_of_a_chunk_per_write_is_folded_at_its_first_append(tmp_path: Path) -> None:
    # as the layout before folding left it: a list of 1 and 40 chunks of one element
    old = window_backend(tmp_path / "old", "w")
    contents = old.create_state(MapStateDescriptor("window-contents"))
    appends = old.create_state(MapStateDescriptor(WINDOW_APPENDS))
    old.key_context.key = "a"
    contents.put((0, 500), [{"k": "a", "ts": 0, "v": 0}])
    for v in range(1, 41):
        appends.put((0, 500, v), [{"k": "a", "ts": v, "v": v}])
    restored = _snapshot_restore(_NothingHeld(old), tmp_path, 1)
    old.close()
    op = _process(tmp_path, restored)
    assert op._stored == {("a", 0): 40}
    op.process_batch(_record(41))
    op.prepare_snapshot_pre_barrier(2)
    assert _chunks(op) == 0  # 41 chunks of one, then one more: folded into the list
    assert op._chunk_sizes == {("a", 0): [42]}
    assert op.process_watermark(499) == [("a", 0, 500, list(range(42)))]
    restored.close()


def _sliding(tmp: Path, lateness: int = 0, *, one_list: bool = False, cache: int = 10**6) -> Any:
    """A process operator of sliding windows (size 500, slide 250): the general path."""
    spec = WindowSpec(
        assigner=SlidingEventTimeWindows.of(500, 250),
        kind=WindowKind.PROCESS,
        timestamp_assigner=lambda e: e["ts"],
        function=CountElements(),
        allowed_lateness=lateness,
    )
    op = open_window_operator(spec, lambda e: e["k"], window_backend(tmp, "s", cache))
    op.side_output = []
    if one_list:
        op._appends = None  # each write rewrites the window's list, as before appending
    return op


def test_sliding_windows_append_each_batch_and_fire_what_one_list_fires(tmp_path: Path) -> None:
    # one record a batch into windows [-250, 250) and [0, 500) of key a: the general path
    # rewrote each window's whole list per batch (300 batches: 45,150 elements written a
    # window); appended and folded, ~5 writes per element and at most log1.5(n) + 1 entries.
    n = 300
    op, reference = _sliding(tmp_path / "op"), _sliding(tmp_path / "ref", one_list=True)
    counts = _count(op)
    for v in range(n):
        batch = [{"k": "a", "ts": v % 250, "v": v}]
        assert op.process_batch(batch) == reference.process_batch(batch) == []
        op.backend.key_context.key = "a"
        for start, end in ((-250, 250), (0, 500)):
            chunks = getattr(op, "_appended", {}).get(("a", start, end), 0)
            assert chunks + 1 <= _bound(v + 1)
    assert counts["written"] < 2 * 6 * n  # old: 2 * n * (n + 1) / 2
    counts.update(written=0, read=0)
    fired = op.process_watermark(499)
    assert fired == reference.process_watermark(499)
    assert [f[1:3] for f in fired] == [(-250, 250), (0, 500)]
    assert fired[0][3] == fired[1][3] == list(range(n))
    assert counts == {"written": 0, "read": 2 * n}
    assert list(op.backend.keys(WINDOW_APPENDS)) == []
    op.backend.close()
    reference.backend.close()


def test_sliding_windows_past_the_state_cache_read_only_what_they_fold(tmp_path: Path) -> None:
    # keys a and b in turn, a state cache of one key: each batch's key was evicted. The
    # general path read each window's whole list back per batch (old: 2 windows x 2 keys x
    # 99 x 100 / 2 elements read); now a window written in this run is known stored without
    # a read, and only what a fold takes in is read back.
    n = 100
    op = _sliding(tmp_path / "op", cache=1)
    reference = _sliding(tmp_path / "ref", one_list=True)
    counts = _count(op)
    for v in range(n):
        for k in "ab":
            batch = [{"k": k, "ts": v % 250, "v": v}]
            assert op.process_batch(batch) == reference.process_batch(batch) == []
    assert counts["read"] < counts["written"] < 2 * 2 * 6 * n
    assert sorted(op.process_watermark(499)) == sorted(reference.process_watermark(499))
    op.backend.close()
    reference.backend.close()


def test_sliding_windows_fire_late_with_their_chunks_and_clean_them_up(tmp_path: Path) -> None:
    # allowed lateness: records after a window's end fire it again at once, with its list
    # and chunks; its cleanup removes the chunks; a restore folds them into the list
    op, reference = (
        _sliding(tmp_path / "op", 1_000),
        _sliding(tmp_path / "ref", 1_000, one_list=True),
    )
    steps: list[Any] = [[{"k": "a", "ts": v, "v": v}] for v in range(10)]
    steps += [499, [{"k": "a", "ts": 20, "v": 20}], [{"k": "a", "ts": 21, "v": 21}]]
    for step in steps:
        for o in (op, reference):
            o.out = o.process_batch(step) if isinstance(step, list) else o.process_watermark(step)
        assert op.out == reference.out
    late = [*range(10), 20, 21]
    assert sorted(op.out) == [("a", -250, 250, late), ("a", 0, 500, late)]
    assert op._appended  # the late records were appended
    restored = _snapshot_restore(op, tmp_path, 1)
    op.backend.close()
    spec_op = _sliding(tmp_path / "after", 1_000)
    spec_op.backend.close()
    after = open_window_operator(spec_op.spec, lambda e: e["k"], restored)
    assert list(restored.keys(WINDOW_APPENDS)) == [] and after._appended == {}
    after.restore_watermark(499)
    batch = [{"k": "a", "ts": 22, "v": 22}]
    assert after.process_batch(batch) == reference.process_batch(batch)
    for o in (after, reference):
        o.out = o.process_watermark(1_499)  # every cleanup
    assert after.out == reference.out
    assert list(restored.keys(WINDOW_APPENDS)) == list(restored.keys("window-contents")) == []
    restored.close()
    reference.backend.close()
