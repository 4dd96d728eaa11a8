"""What the coordinator sends through the job: barrier n, its kind, and its cancellation.

The checkpoint protocol's own types, so the coordinator, the barrier handlers
and the tasks share them without the protocol depending on the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class CheckpointKind(Enum):
    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


@dataclass(frozen=True, slots=True)
class CheckpointBarrier:
    """Barrier n: everything before it belongs to snapshot n, nothing after it does.

    An ``unaligned`` barrier (Flink's FLIP-76) travels ahead of the records
    queued in front of it; what it overtook is in flight, persisted with n as
    channel state (``barrier.unaligned``) instead of waited for. A
    ``timeoutable`` one starts aligned and turns unaligned at a task whose
    alignment takes longer than ``checkpoint.aligned_timeout`` (Flink's
    ``alignedCheckpointTimeout``). Savepoints are always aligned.
    """

    checkpoint_id: int
    timestamp: float
    kind: CheckpointKind = CheckpointKind.CHECKPOINT
    unaligned: bool = False
    timeoutable: bool = False

    def as_unaligned(self) -> CheckpointBarrier:
        """Return this barrier to be forwarded unaligned (its alignment timed out here)."""
        return CheckpointBarrier(self.checkpoint_id, self.timestamp, self.kind, unaligned=True)


@dataclass(frozen=True, slots=True)
class CancelCheckpoint:
    """Checkpoint n was declined somewhere; drop any alignment for it."""

    checkpoint_id: int
