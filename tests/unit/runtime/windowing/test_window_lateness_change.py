"""A savepoint restored with another allowed lateness: windows fire once and are cleaned up.

With allowed lateness the window timers are keyed state; without it they are
derived from the stored windows when the operator opens. A window that fired
but waits for its cleanup is still in a savepoint taken with lateness. As in
Flink, it is not emitted again unless a late record arrives for it (and with
the new lateness that record may be late); every window is cleaned up at its
end plus the *new* lateness, and a window that had not fired still fires once.
Each test takes a real savepoint of the backend and restores it into a new one.
Last, a late record that grows a fired session past the watermark.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.jobspec.functions import OutputTag
from aiostream_ckpt.jobspec.graph import WindowKind, WindowSpec
from aiostream_ckpt.runtime.windowing.session_windows import SESSIONS
from aiostream_ckpt.runtime.windowing.window_operator import WINDOW_CONTENTS
from aiostream_ckpt.state.backend import SnapshotTarget
from aiostream_ckpt.state.lmdb import LmdbStateBackend
from aiostream_ckpt.time import (
    CountAggregate,
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)
from aiostream_ckpt.time.timers import EVENT_TIMERS
from tests.unit.time.support import open_window_operator, window_backend

LATE: OutputTag[Any] = OutputTag("late")
WINDOWS = {"tumbling": WINDOW_CONTENTS, "session": SESSIONS, "sliding": WINDOW_CONTENTS}


def _open(backend: LmdbStateBackend, kind: str, lateness: int, assigner: Any = None) -> Any:
    if assigner is None:
        assigner = {  # sliding: tumbling's windows on the general path
            "tumbling": TumblingEventTimeWindows.of(1_000),
            "sliding": SlidingEventTimeWindows.of(1_000, 1_000),
            "session": EventTimeSessionWindows.with_gap(1_000),
        }[kind]
    spec = WindowSpec(
        assigner=assigner,
        kind=WindowKind.AGGREGATE,
        timestamp_assigner=lambda e: e["ts"],
        function=CountAggregate(),
        allowed_lateness=lateness,
        late_tag=LATE,
    )
    op = open_window_operator(spec, lambda e: e["k"], backend)
    op.side_output = []
    return op


def _savepoint(backend: LmdbStateBackend, tmp: Path) -> LmdbStateBackend:
    """Take a savepoint of ``backend`` and restore it into a new backend (closing the old)."""
    root = tmp / "savepoints"
    root.mkdir()
    target = SnapshotTarget(
        checkpoint_id=1,
        root=root,
        exclusive_dir=root / "savepoint-1",
        shared_dir=root / "shared",
        is_savepoint=True,
    )
    part = backend.snapshot(target)
    asyncio.run(part.prepare())
    handle = part.write()
    asyncio.run(part.settle())
    backend.close()
    restored = window_backend(tmp / "restored", backend.operator_uid)
    restored.restore(root, [handle])
    return restored


def _before(tmp: Path, kind: str, lateness: int) -> tuple[LmdbStateBackend, list[Any]]:
    """u and v each have a window that fired at watermark 1_200; u has one that has not.

    Tumbling: u's [0, 1000) holds 2, v's 1, u's [1000, 2000) 1. Sessions: u's
    [0, 1200) holds 2 and [3000, 4000) 1 (it has not fired), v's [100, 1100) 1.
    """
    backend = window_backend(tmp / "before", "w")
    op = _open(backend, kind, lateness)
    second = 1_500 if kind == "tumbling" else 3_000
    records = [{"k": "u", "ts": 100}, {"k": "u", "ts": 200}, {"k": "v", "ts": 100}]
    out = op.process_batch([*records, {"k": "u", "ts": second}])
    out += op.process_watermark(1_200)
    op.prepare_snapshot_pre_barrier(1)  # the savepoint's barrier: held windows into state
    return backend, out


def _stored(op: Any, kind: str) -> list[Any]:
    """Keys with windows in keyed state, as a snapshot now would hold them."""
    op.prepare_snapshot_pre_barrier(2)
    return sorted(op.backend.keys(WINDOWS[kind]))


@pytest.mark.parametrize("kind", ["tumbling", "session"])
@pytest.mark.parametrize("watermark_restored", [True, False])
def test_lateness_to_none_fired_windows_do_not_fire_again(
    tmp_path: Path, kind: str, watermark_restored: bool
) -> None:
    # before: the derived timers gave every stored window its end's timer, fired ones too:
    # each fired again at the first watermark after the restore (duplicate output)
    backend, out = _before(tmp_path, kind, lateness=60_000)
    assert sorted(out) == [1, 2]
    backend = _savepoint(backend, tmp_path)
    op = _open(backend, kind, lateness=0)
    if watermark_restored:  # a rescaled restore may resume at a lower watermark
        op.restore_watermark(1_200)
    assert op.process_watermark(1_300) == []
    # their cleanup is due (end + 0 <= the watermark): dropped at open, not fired
    assert _stored(op, kind) == ["u"]
    assert list(backend.keys(EVENT_TIMERS)) == []
    assert op.process_batch([{"k": "v", "ts": 300}]) == []  # late now
    assert op.side_output == [(LATE, {"k": "v", "ts": 300})]
    assert op.process_watermark(100_000) == [1]  # u's unfired window, once
    assert _stored(op, kind) == []
    backend.close()


@pytest.mark.parametrize("kind", ["tumbling", "session"])
def test_no_lateness_to_lateness_keeps_every_window(tmp_path: Path, kind: str) -> None:
    backend, out = _before(tmp_path, kind, lateness=0)
    assert sorted(out) == [1, 2]
    backend = _savepoint(backend, tmp_path)
    op = _open(backend, kind, lateness=60_000)
    op.restore_watermark(1_200)
    assert op.process_watermark(1_300) == []
    # a record for a window cleaned up before the savepoint: not late now, a new window
    assert op.process_batch([{"k": "v", "ts": 300}]) == [1]
    assert op.process_watermark(10_000) == [1]  # u's unfired window, once
    assert op.process_watermark(100_000) == []
    assert _stored(op, kind) == []
    assert list(backend.keys(EVENT_TIMERS)) == []
    backend.close()


@pytest.mark.parametrize("kind", ["tumbling", "session"])
@pytest.mark.parametrize("after", [2_000, 90_000])
def test_changed_lateness_cleans_up_at_the_new_lateness(
    tmp_path: Path, kind: str, after: int
) -> None:
    # before: cleanup matched only the old lateness's timer (a window never cleaned up);
    # sessions re-fired their fired sessions (the new cleanup time had no timer)
    backend, out = _before(tmp_path, kind, lateness=60_000)
    assert sorted(out) == [1, 2]
    backend = _savepoint(backend, tmp_path)
    op = _open(backend, kind, lateness=after)
    op.restore_watermark(1_200)
    assert op.process_watermark(1_300) == []
    # u's fired window, not late under either lateness: fires again with the record
    out = op.process_batch([{"k": "u", "ts": 150}])
    assert out == [3]
    out += op.process_watermark(998 + after)  # before any window's end plus the new lateness
    assert _stored(op, kind) == ["u", "v"]
    out += op.process_watermark(3_999 + after)
    assert _stored(op, kind) == []  # cleaned up at the new lateness
    assert sorted(out) == [1, 3]  # and u's unfired window fired once
    assert op.process_watermark(200_000) == []
    assert _stored(op, kind) == []
    assert list(backend.keys(EVENT_TIMERS)) == []
    backend.close()


class _OddLongSessions(EventTimeSessionWindows):
    """Sessions whose records at an odd time open 5 s, others 1 s (not the inlined path)."""

    def bounds(self, timestamp: int) -> list[tuple[int, int]]:
        return [(timestamp, timestamp + (5_000 if timestamp % 2 else 1_000))]


@pytest.mark.parametrize("path", ["inline", "general"])
def test_a_late_record_that_grows_a_fired_session_past_the_watermark_fires_it_again(
    tmp_path: Path, path: str
) -> None:
    # before: the grown session had only its old cleanup timer, after its new end:
    # it never fired, and was dropped at the cleanup (its records lost)
    backend = window_backend(tmp_path, "w")
    assigner = _OddLongSessions(1_000) if path == "general" else None
    op = _open(backend, "session", 60_000, assigner)
    out = op.process_batch([{"k": "u", "ts": 0}, {"k": "u", "ts": 500}])
    out += op.process_watermark(2_000)
    assert out == [2]  # [0, 1500)
    out += op.process_batch([{"k": "u", "ts": 1_400}])  # not late: [0, 2400), past 2000
    assert out == [2] and op.open_sessions("u") == [(0, 2_400)]
    out += op.process_watermark(2_399)
    assert out == [2, 3]  # at its new end, as Flink's merging trigger does
    out += op.process_watermark(62_399)
    assert out == [2, 3] and op.open_sessions("u") == []
    backend.close()


def test_fired_sessions_merged_past_the_watermark_fire_at_the_merged_end(tmp_path: Path) -> None:
    backend = window_backend(tmp_path, "w")
    op = _open(backend, "session", 60_000, _OddLongSessions(1_000))
    out = op.process_batch([{"k": "u", "ts": 0}, {"k": "u", "ts": 1_100}])
    out += op.process_watermark(2_200)
    assert out == [1, 1]  # [0, 1000) and [1100, 2100)
    out += op.process_batch([{"k": "u", "ts": 999}])  # [999, 5999) bridges both
    assert op.open_sessions("u") == [(0, 5_999)]
    out += op.process_watermark(5_998)
    assert out == [1, 1, 3]
    out += op.process_watermark(65_998)
    assert op.open_sessions("u") == []
    backend.close()


@pytest.mark.parametrize("kind", ["tumbling", "session", "sliding"])
@pytest.mark.parametrize("watermark", [5_000, 2_600])
def test_a_lowered_lateness_cleanup_at_another_fired_windows_end_fires_nothing(
    tmp_path: Path, kind: str, watermark: int
) -> None:
    # u's two windows fired before the savepoint: tumbling [0, 1000) and [1000, 2000),
    # sessions [100, 1100) and [1500, 2500). Restored with a lateness that puts the
    # first one's cleanup at the second one's end (999 + 1000, 1099 + 1400), before the
    # watermark. Before: that cleanup's timer fired the second window again.
    backend = window_backend(tmp_path / "before", "w")
    op = _open(backend, kind, lateness=60_000)
    second = 1_500 if kind == "session" else 1_000
    out = op.process_batch([{"k": "u", "ts": 100}, {"k": "u", "ts": second}])
    out += op.process_watermark(watermark)
    assert out == [1, 1]
    op.prepare_snapshot_pre_barrier(1)
    backend = _savepoint(backend, tmp_path)
    op = _open(backend, kind, lateness=1_400 if kind == "session" else 1_000)
    op.restore_watermark(watermark)
    assert op.process_watermark(watermark + 1) == []
    assert op._restored_fired == set()  # their ends are behind the watermark: none kept
    assert op.process_watermark(200_000) == []
    assert _stored(op, kind) == []
    assert list(backend.keys(EVENT_TIMERS)) == []
    backend.close()


@pytest.mark.parametrize("kind", ["tumbling", "session", "sliding"])
def test_a_record_for_a_window_whose_lowered_cleanup_passed_is_late_at_once(
    tmp_path: Path, kind: str
) -> None:
    # u's [0, 1000) (the session [100, 1100)) fired before the savepoint at watermark
    # 2500; restored with lateness 1000 its cleanup is due before any watermark moves.
    # Before: a record touching the session merged into it and fired it again (late in
    # a run that lowered nothing), and the cleanup's timer stayed at or before the
    # watermark, in the next checkpoint too.
    backend = window_backend(tmp_path / "before", "w")
    op = _open(backend, kind, lateness=60_000)
    out = op.process_batch([{"k": "u", "ts": 100}, {"k": "u", "ts": 3_500}])
    out += op.process_watermark(2_500)
    assert out == [1]
    op.prepare_snapshot_pre_barrier(1)
    backend = _savepoint(backend, tmp_path)
    op = _open(backend, kind, lateness=1_000)
    op.restore_watermark(2_500)
    first = op.timer_service.first_event_timers()
    assert first == {"u": 4_499 if kind == "session" else 3_999}  # the cleanup is done
    assert op.process_batch([{"k": "u", "ts": 400}]) == []
    assert op.side_output == [(LATE, {"k": "u", "ts": 400})]
    assert op.process_watermark(100_000) == [1]  # u's unfired window, once
    assert _stored(op, kind) == []
    assert list(backend.keys(EVENT_TIMERS)) == []
    backend.close()
