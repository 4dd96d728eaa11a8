"""Barrier handling for tasks with several input channels.

A handler sees every control element and record batch by channel and decides
what the task does with it: process now, hold, or snapshot. The two modes of
the design are two classes, not a flag: :class:`~.aligned.AlignedBarrierHandler`
(exactly-once) and :class:`~.tracker.CheckpointBarrierTracker` (at-least-once).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier


class AlignmentState(Enum):
    """Lifecycle of one alignment; transitions are checked."""

    IDLE = "idle"
    ALIGNING = "aligning"

    def can_become(self, other: AlignmentState) -> bool:
        return other is not self


@dataclass(slots=True)
class BarrierDecision:
    """What the task must do after a barrier.

    Snapshot (and forward) ``barrier``, then replay ``released`` (held elements,
    in arrival order) before reading on.
    """

    barrier: CheckpointBarrier | None
    alignment_seconds: float
    released: list[tuple[int, Any]]


class BarrierHandler(ABC):
    """Decides when a multi-input task snapshots, and what it holds meanwhile."""

    def __init__(self, num_channels: int, monotonic: Callable[[], float]) -> None:
        self.num_channels = num_channels
        self._monotonic = monotonic
        #: True while some channel's post-barrier elements must be held (fast-path check).
        self.holding = False

    @abstractmethod
    def is_held(self, channel: int) -> bool:
        """Whether elements from ``channel`` must be held right now."""

    @abstractmethod
    def hold(self, channel: int, element: Any) -> None:
        """Keep ``element`` of ``channel`` until the current alignment ends."""

    @abstractmethod
    def on_barrier(self, channel: int, barrier: CheckpointBarrier) -> BarrierDecision | None:
        """Register barrier arrival; a decision when the task must snapshot now."""

    @abstractmethod
    def abort(self, checkpoint_id: int) -> list[tuple[int, Any]]:
        """Give up on ``checkpoint_id``: return held elements for replay."""
