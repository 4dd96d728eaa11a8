"""The unaligned barrier handler's decisions, and what each checkpoint's channel state holds.

Pure values, no task: the tests hand the handler barriers and elements in the
order a task takes them and check what it decides and what in-flight elements
it hands over (``InFlight.channels``), which is what the checkpoint stores.
"""

from __future__ import annotations

from typing import Any

from aiostream_ckpt.barrier.aligned import AlignedBarrierHandler
from aiostream_ckpt.barrier.alternating import AlternatingBarrierHandler
from aiostream_ckpt.barrier.handler import AlignmentState
from aiostream_ckpt.barrier.unaligned import UnalignedBarrierHandler
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier, CheckpointKind
from aiostream_ckpt.runtime.channel_state import ChannelStateCodec, ChannelStateError
from aiostream_ckpt.runtime.elements import END_OF_INPUT, SecondInput, Watermark


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def unaligned(cid: int) -> CheckpointBarrier:
    return CheckpointBarrier(cid, 0.0, unaligned=True)


def copy(element: Any) -> Any:
    """The test's encode: a copy of a batch (what was noted must not change afterwards)."""
    if element is END_OF_INPUT:
        return None
    return list(element) if type(element) is list else element


def test_snapshot_at_first_barrier_then_collect_until_the_last() -> None:
    clock = Clock()
    h = UnalignedBarrierHandler(3, clock, copy)
    # barrier 1 overtook two batches queued on channel 0: snapshot now, nothing held
    d = h.on_barrier(0, unaligned(1), [[1, 2], [3]])
    assert d is not None and d.barrier == unaligned(1) and d.released == []
    assert d.in_flight is None and h.holding
    # channel 0 passed its barrier: what comes on it now is after the snapshot
    assert not h.is_held(0)
    # channels 1 and 2 have not: what the task takes from them is in flight, and processed
    batch = [10, 11]
    assert h.is_held(1) and h.hold(1, batch) is False
    batch.append(99)  # an operator changing the record afterwards changes nothing noted
    assert h.hold(2, Watermark(7)) is False
    assert h.hold(2, END_OF_INPUT) is False  # processed, never replayed
    assert h.on_barrier(2, unaligned(1), [[20]]) is None
    clock.now = 100.25
    d = h.on_barrier(1, unaligned(1), [[12], [13]])
    assert d is not None and d.barrier is None and not h.holding
    assert d.in_flight is not None and d.in_flight.error is None
    assert d.in_flight.checkpoint_id == 1
    assert d.in_flight.channels == {
        0: [[1, 2], [3]],
        1: [[10, 11], [12], [13]],
        2: [Watermark(7), [20]],
    }
    assert d.in_flight.seconds == 0.25
    assert h.on_barrier(1, unaligned(1)) is None  # late: already complete


def test_single_channel_snapshots_and_completes_at_once() -> None:
    h = UnalignedBarrierHandler(1, Clock(), copy)
    d = h.on_barrier(0, unaligned(4), [[1], [2]])
    assert d is not None and d.barrier is not None and d.barrier.unaligned
    assert d.in_flight is not None and d.in_flight.channels == {0: [[1], [2]]}
    assert not h.holding


def test_aligned_barrier_of_the_current_checkpoint_is_forwarded_unaligned() -> None:
    """Where a checkpoint turned unaligned upstream, a channel's barrier may still be aligned."""
    h = UnalignedBarrierHandler(2, Clock(), copy)
    d = h.on_barrier(0, CheckpointBarrier(2, 0.0))
    assert d is not None and d.barrier == CheckpointBarrier(2, 0.0, unaligned=True)


def test_newer_barrier_abandons_an_incomplete_checkpoint() -> None:
    h = UnalignedBarrierHandler(2, Clock(), copy)
    h.on_barrier(0, unaligned(1), [[1]])
    h.hold(1, [2])
    d = h.on_barrier(1, unaligned(2), [[3]])
    assert d is not None and d.abandoned == 1 and d.barrier == unaligned(2)
    d = h.on_barrier(0, unaligned(2), [])
    assert d is not None and d.in_flight is not None
    assert d.in_flight.channels == {0: [], 1: [[3]]}  # nothing of checkpoint 1
    assert h.on_barrier(0, unaligned(1)) is None


def test_a_record_the_codec_refuses_declines_the_checkpoint_not_the_job() -> None:
    h = UnalignedBarrierHandler(2, Clock(), ChannelStateCodec(allow_pickle=False).encode)
    h.on_barrier(0, unaligned(1), [[{"a": 1}]])
    assert h.hold(1, [{"t": (1, 2)}]) is False  # a tuple would come back a list
    d = h.on_barrier(1, unaligned(1))
    assert d is not None and d.in_flight is not None
    assert isinstance(d.in_flight.error, ChannelStateError)
    assert "state.allow_pickle=true" in str(d.in_flight.error)
    assert d.in_flight.channels == {0: [], 1: []}


def test_pickle_when_allowed_and_frames_come_back_the_same() -> None:
    codec = ChannelStateCodec(allow_pickle=True)
    elements = [[{"t": (1, 2)}], SecondInput([{"x": 1}]), Watermark(5), [1, "a"]]
    frames = [codec.encode(e) for e in elements]
    assert all(f is not None for f in frames)
    back = [codec.decode(kind, payload) for kind, payload, _ in frames]  # type: ignore[misc]
    assert back[0] == [{"t": (1, 2)}] and back[2] == Watermark(5) and back[3] == [1, "a"]
    assert type(back[1]) is SecondInput and back[1].batch == [{"x": 1}]
    assert [n for _, _, n in frames] == [1, 1, 0, 2]  # type: ignore[misc]


def aligned_then_unaligned() -> tuple[AlternatingBarrierHandler, Clock]:
    clock = Clock()
    aligned = AlignedBarrierHandler(2, clock)
    return AlternatingBarrierHandler(
        2, clock, aligned, UnalignedBarrierHandler(2, clock, copy)
    ), clock


def test_savepoints_stay_aligned_under_unaligned_checkpoints() -> None:
    h, _ = aligned_then_unaligned()
    savepoint = CheckpointBarrier(3, 0.0, CheckpointKind.SAVEPOINT)
    assert h.on_barrier(0, savepoint) is None
    assert h.holding and h.is_held(0) and not h.is_held(1)
    assert h.hold(0, [1]) is True  # after the savepoint's barrier: held back
    d = h.on_barrier(1, savepoint)
    assert d is not None and d.barrier == savepoint and d.released == [(0, [1])]
    assert d.in_flight is None


def test_unaligned_barrier_overtakes_an_alignment_and_takes_its_held_records_along() -> None:
    h, _ = aligned_then_unaligned()
    savepoint = CheckpointBarrier(3, 0.0, CheckpointKind.SAVEPOINT)
    h.on_barrier(0, savepoint)
    h.hold(0, [1])
    h.hold(0, [2])
    assert h.hold(0, unaligned(4)) is False  # it goes to on_barrier, not into the hold
    d = h.on_barrier(0, unaligned(4), [[5]])
    assert d is not None and d.abandoned == 3 and d.barrier == unaligned(4)
    assert d.released == [(0, [1]), (0, [2])]  # processed after the snapshot ...
    # ... and in flight for checkpoint 4 on channel 0, with what was queued behind them
    assert h.hold(1, [6]) is False
    d = h.on_barrier(1, unaligned(4), [])
    assert d is not None and d.in_flight is not None
    assert d.in_flight.channels == {0: [[1], [2], [5]], 1: [[6]]}


def test_an_unaligned_checkpoint_collects_while_a_later_savepoint_aligns() -> None:
    """Barriers keep their order per channel: never both on one channel."""
    h, _ = aligned_then_unaligned()
    h.on_barrier(0, unaligned(5), [])
    savepoint = CheckpointBarrier(6, 0.0, CheckpointKind.SAVEPOINT)
    assert h.on_barrier(0, savepoint) is None  # channel 0 passed 5, now holds for 6
    assert h.hold(0, [1]) is True
    assert h.hold(1, [2]) is False  # channel 1 has not reached 5: in flight for it
    d = h.on_barrier(1, unaligned(5), [[3]])
    assert d is not None and d.in_flight is not None
    assert d.in_flight.channels == {0: [], 1: [[2], [3]]}
    d = h.on_barrier(1, savepoint)
    assert d is not None and d.barrier == savepoint and d.released == [(0, [1])]


def test_lifecycle_states() -> None:
    assert AlignmentState.COLLECTING.can_become(AlignmentState.IDLE)
    assert not AlignmentState.IDLE.can_become(AlignmentState.IDLE)


def timed(cid: int) -> CheckpointBarrier:
    return CheckpointBarrier(cid, 0.0, timeoutable=True)


def aligned_with_timeout() -> tuple[AlternatingBarrierHandler, Clock]:
    clock = Clock()
    return AlternatingBarrierHandler(
        3, clock, AlignedBarrierHandler(3, clock), UnalignedBarrierHandler(3, clock, copy), 2.0
    ), clock


def test_alignment_timeout_turns_the_checkpoint_unaligned_from_there() -> None:
    h, clock = aligned_with_timeout()
    assert h.on_barrier(0, timed(7)) is None  # aligned first: channel 0 held
    assert h.hold(0, [1]) is True
    assert h.hold(1, [2]) is False  # not held: channel 1 has not reached barrier 7
    clock.now += 2.5
    d = h.on_alignment_timeout(timed(7))
    assert d is not None and d.barrier is not None and d.barrier.unaligned
    assert d.alignment_seconds == 2.5 and d.prioritize == 7
    assert d.released == [(0, [1])]  # after channel 0's barrier: processed, not in flight
    # from now on channels 1 and 2 are in flight until their barriers come
    assert not h.is_held(0) and h.is_held(1) and h.hold(1, [3]) is False
    assert h.on_barrier(1, CheckpointBarrier(7, 0.0, unaligned=True), [[4]]) is None
    d = h.on_barrier(2, timed(7))  # came in line: nothing of channel 2 before it is left
    assert d is not None and d.in_flight is not None
    assert d.in_flight.channels == {0: [], 1: [[3], [4]], 2: []}
    assert h.on_barrier(0, timed(7)) is None and h.on_alignment_timeout(timed(7)) is None


def test_timeout_before_any_barrier_was_taken_snapshots_at_once() -> None:
    """The barrier still waits in line behind records: the gate moves it ahead."""
    h, _ = aligned_with_timeout()
    d = h.on_alignment_timeout(timed(8))
    assert d is not None and d.barrier == timed(8).as_unaligned() and d.prioritize == 8
    assert d.alignment_seconds == 2.0 and h.is_held(0) and h.is_held(2)


def test_a_checkpoint_done_aligned_in_time_ignores_its_timer() -> None:
    h, _ = aligned_with_timeout()
    for c in range(3):
        d = h.on_barrier(c, timed(9))
    assert d is not None and d.barrier == timed(9) and d.in_flight is None
    assert h.on_alignment_timeout(timed(9)) is None


def test_an_unaligned_barrier_of_the_aligning_checkpoint_switches_it() -> None:
    """Upstream it timed out and came on unaligned: here it turns unaligned at once."""
    h, _ = aligned_with_timeout()
    h.on_barrier(0, timed(4))
    h.hold(0, [1])
    d = h.on_barrier(1, CheckpointBarrier(4, 0.0, unaligned=True), [[5]])
    assert d is not None and d.barrier is not None and d.barrier.unaligned
    assert d.released == [(0, [1])] and d.prioritize == 4 and d.in_flight is None
    d = h.on_barrier(2, CheckpointBarrier(4, 0.0, unaligned=True), [])
    assert d is not None and d.in_flight is not None
    assert d.in_flight.channels == {0: [], 1: [[5]], 2: []}
