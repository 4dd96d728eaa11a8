"""Barrier handling for tasks with several input channels.

A handler sees every control element and record batch by channel and decides
what the task does with it: process now, hold, note, or snapshot. The modes
of the design are classes, not flags: :class:`~.aligned.AlignedBarrierHandler`
(exactly-once), :class:`~.unaligned.UnalignedBarrierHandler` (exactly-once,
barriers overtake what is queued: Flink's unaligned checkpoints),
:class:`~.alternating.AlternatingBarrierHandler` (the two, per checkpoint, as
Flink's ``AlternatingController``) and :class:`~.tracker.CheckpointBarrierTracker`
(at-least-once).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier


class AlignmentState(Enum):
    """Lifecycle of one alignment; transitions are checked."""

    IDLE = "idle"
    ALIGNING = "aligning"
    #: unaligned: snapshotted; the channels' in-flight elements are collected until
    #: the last barrier comes (Flink's ``CollectingBarriersUnaligned``)
    COLLECTING = "collecting"

    def can_become(self, other: AlignmentState) -> bool:
        return other is not self


@dataclass(slots=True)
class InFlight:
    """The channel state of unaligned checkpoint ``checkpoint_id`` at one task, complete.

    ``channels`` maps each channel to its in-flight elements, in order, as the
    handler's ``encode`` made them: what was queued in front of the barrier
    when it overtook it, and what came on that channel after the snapshot
    until its barrier did. ``error`` is set when an element could not be
    encoded: the checkpoint is declined, the job goes on.
    """

    checkpoint_id: int
    channels: dict[int, list[Any]]
    #: from the snapshot to the last barrier
    seconds: float
    error: BaseException | None = None


@dataclass(slots=True)
class BarrierDecision:
    """What the task must do after a barrier.

    Snapshot (and forward) ``barrier``, then replay ``released`` (held elements,
    in arrival order) before reading on. ``in_flight``: an unaligned checkpoint's
    channel state is complete (it goes with that checkpoint's acknowledgement);
    ``abandoned``: a checkpoint this task gave up for a newer one (it declines it).
    """

    barrier: CheckpointBarrier | None
    alignment_seconds: float
    released: list[tuple[int, Any]]
    in_flight: InFlight | None = None
    abandoned: int | None = None
    #: the checkpoint turned unaligned here: the gate moves its barriers still in line ahead
    prioritize: int | None = None


class BarrierHandler(ABC):
    """Decides when a multi-input task snapshots, and what it holds meanwhile."""

    #: whether ``on_barrier`` wants, for an unaligned barrier, its channel's elements in line
    keeps_in_flight: ClassVar[bool] = False

    def __init__(self, num_channels: int, monotonic: Callable[[], float]) -> None:
        self.num_channels = num_channels
        self._monotonic = monotonic
        #: True while some channel's elements must go through :meth:`hold` (fast-path check).
        self.holding = False

    @abstractmethod
    def is_held(self, channel: int) -> bool:
        """Whether elements from ``channel`` must go through :meth:`hold` right now."""

    @abstractmethod
    def hold(self, channel: int, element: Any) -> bool:
        """Take ``element`` of ``channel``: True if kept until the alignment ends.

        False: the task processes it now (an unaligned handler noted a copy of
        it as in flight, or it is a barrier that must reach :meth:`on_barrier`).
        """

    @abstractmethod
    def on_barrier(
        self, channel: int, barrier: CheckpointBarrier, in_line: Sequence[Any] = ()
    ) -> BarrierDecision | None:
        """Register barrier arrival; a decision when the task must act now.

        ``in_line``: for an unaligned barrier (one that overtook what its
        channel had queued), those elements, in order; they are in flight.
        """

    @abstractmethod
    def abort(self, checkpoint_id: int) -> list[tuple[int, Any]]:
        """Give up on ``checkpoint_id``: return held elements for replay."""

    def on_alignment_timeout(self, barrier: CheckpointBarrier) -> BarrierDecision | None:
        """``barrier`` waited here for ``checkpoint.aligned_timeout``; a decision to switch."""
        return None
