"""What flows through channels: batches of records, and control elements.

A batch is a plain ``list`` (the fast path checks ``type(x) is list``); all
other elements are control elements that every task must forward in order.
The checkpoint's own elements (barriers) live in ``checkpoint.barriers``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiostream_ckpt.checkpoint.barriers import CancelCheckpoint, CheckpointBarrier


class SecondInput:
    """A batch of the second input of a two-input operator (``runtime.two_input.co_process``).

    Not a ``list``: the plain loop hands it to the task's control path, which
    a two-input task extends.
    """

    __slots__ = ("batch",)

    def __init__(self, batch: list[Any]) -> None:
        self.batch = batch


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
class AlignmentTimeout:
    """Task-internal: ``barrier`` has waited here for ``checkpoint.aligned_timeout``.

    Queued in the task's priority lane by its timer; the task's barrier
    handler then turns the checkpoint unaligned here (``barrier.alternating``).
    """

    barrier: CheckpointBarrier


@dataclass(frozen=True, slots=True)
class EndOfInput:
    """The upstream instance will send no more records (it may still send barriers)."""


END_OF_INPUT = EndOfInput()
IDLE = WatermarkStatus(idle=True)
ACTIVE = WatermarkStatus(idle=False)
PROCESSING_TIME_TICK = ProcessingTimeTick()
ControlElement = (
    CheckpointBarrier
    | Watermark
    | WatermarkStatus
    | ProcessingTimeTick
    | AlignmentTimeout
    | EndOfInput
    | CancelCheckpoint
)
