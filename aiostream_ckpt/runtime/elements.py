"""What flows through channels: batches of records, and control elements.

A batch is a plain ``list`` (the fast path checks ``type(x) is list``); all
other elements are control elements that every task must forward in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class CheckpointKind(Enum):
    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


@dataclass(frozen=True, slots=True)
class CheckpointBarrier:
    """Barrier n: everything before it belongs to snapshot n, nothing after it does."""

    checkpoint_id: int
    timestamp: float
    kind: CheckpointKind = CheckpointKind.CHECKPOINT


@dataclass(frozen=True, slots=True)
class Watermark:
    """Event time has reached ``timestamp`` (milliseconds): no older record is expected."""

    timestamp: int


@dataclass(frozen=True, slots=True)
class WatermarkStatus:
    """The sender is idle (sends no watermarks for now) or active again.

    An idle channel is left out of the receiver's watermark minimum, so an idle
    partition does not hold event time back.
    """

    idle: bool


@dataclass(frozen=True, slots=True)
class ProcessingTimeTick:
    """Task-internal: a processing-time timer is due; fire it between elements."""


@dataclass(frozen=True, slots=True)
class EndOfInput:
    """The upstream instance will send no more records (it may still send barriers)."""


@dataclass(frozen=True, slots=True)
class CancelCheckpoint:
    """Checkpoint n was declined somewhere; drop any alignment for it."""

    checkpoint_id: int


END_OF_INPUT = EndOfInput()
IDLE = WatermarkStatus(idle=True)
ACTIVE = WatermarkStatus(idle=False)
PROCESSING_TIME_TICK = ProcessingTimeTick()
#: Watermark bounds (milliseconds), as Flink's ``Long.MIN_VALUE`` / ``Long.MAX_VALUE``.
MIN_WATERMARK = -(2**63)
MAX_WATERMARK = 2**63 - 1
ControlElement = (
    CheckpointBarrier
    | Watermark
    | WatermarkStatus
    | ProcessingTimeTick
    | EndOfInput
    | CancelCheckpoint
)
