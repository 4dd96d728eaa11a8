"""What a task runs and how it is doing: its chain, its lifecycle, its counters.

Kept apart from the task's loop so the job graph, the task's checkpoint
component (``runtime.subtask_checkpoint``) and its event time
(``runtime.event_time``) share them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from aiostream_ckpt.aio import Wakeup
from aiostream_ckpt.barrier.handler import BarrierHandler
from aiostream_ckpt.connectors.base import SinkWriter, SourceReader
from aiostream_ckpt.connectors.files import DeadLetterWriter
from aiostream_ckpt.runtime.channels import InputGate
from aiostream_ckpt.runtime.operators import StreamOperator
from aiostream_ckpt.runtime.partitioners import OutputGate
from aiostream_ckpt.time.watermarks import SourceWatermarks


class TaskState(Enum):
    CREATED = "created"
    RUNNING = "running"
    ENDED = "ended"  # input over, waiting for the checkpoint that commits the last output
    FINISHED = "finished"
    FAILED = "failed"

    def can_become(self, other: TaskState) -> bool:
        return other in _TASK_TRANSITIONS[self]


_TASK_TRANSITIONS = {
    TaskState.CREATED: {TaskState.RUNNING, TaskState.FAILED},
    TaskState.RUNNING: {TaskState.ENDED, TaskState.FAILED},
    TaskState.ENDED: {TaskState.FINISHED, TaskState.FAILED},
    TaskState.FINISHED: set(),
    TaskState.FAILED: set(),
}


@dataclass
class TaskMetrics:
    records_in: int = 0
    records_out: int = 0
    batches_in: int = 0
    last_checkpoint_sync_ms: float = 0.0
    last_alignment_ms: float = 0.0
    #: newest checkpoint whose completion this task has acted on (sink commits done)
    last_notified_checkpoint: int | None = None
    #: newest checkpoint this task acknowledged, and the size of the state it acked
    last_acked_checkpoint: int | None = None
    last_checkpoint_size_bytes: int = 0
    #: of the newest acknowledged checkpoint: the in-flight bytes its channel state
    #: holds (0 when aligned), and how long collecting them took after the snapshot
    last_in_flight_bytes: int = 0
    last_in_flight_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChainSpec:
    """What a task runs; built by the job graph."""

    task_id: str
    subtask: int
    parallelism: int
    operators: list[StreamOperator]
    head_uid: str | None = None
    reader: SourceReader | None = None
    #: the reader's ``ConnectorContext.wakeup``: the task sets it when a barrier is queued
    reader_wakeup: Wakeup | None = None
    sink_uid: str | None = None
    writer: SinkWriter | None = None
    #: Malformed input of the source, records whose function raised; its state
    #: kept under ``dead_letter_uid`` (the source's, or the first operator's).
    dead_letter: DeadLetterWriter | None = None
    dead_letter_uid: str | None = None
    #: ``errors.max_process_errors_per_checkpoint`` when ``on_process_error=dead_letter``.
    process_error_limit: int | None = None
    input_gate: InputGate | None = None
    barrier_handler: BarrierHandler | None = None
    outputs: list[OutputGate] = field(default_factory=list)
    #: Set when the source has a watermark strategy.
    source_watermarks: SourceWatermarks | None = None
    #: One entry per input edge (upstream uid, parallelism, partitioning): the meaning
    #: of the input channel indexes, compared before restoring per-channel watermarks.
    input_layout: list[str] = field(default_factory=list)

    @property
    def input_uid(self) -> str | None:
        """The operator whose checkpoint entry holds the task's channel state (the first)."""
        if self.input_gate is None:
            return None
        return self.operators[0].uid if self.operators else self.sink_uid
