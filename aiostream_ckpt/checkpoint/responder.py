"""How a task answers the coordinator about checkpoint n (Flink's ``CheckpointResponder``).

The task's side of the protocol sees only this: where to write its keyed
state, then one acknowledgement or one decline per checkpoint. The
:class:`~aiostream_ckpt.checkpoint.coordinator.CheckpointCoordinator` is the
implementation; tests can put a recorder in its place.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from aiostream_ckpt.checkpoint.metadata import TaskAck
from aiostream_ckpt.checkpoint.participants import CheckpointListener, TriggerTarget
from aiostream_ckpt.state.backend import SnapshotTarget


class CheckpointResponder(Protocol):
    def snapshot_target(self, checkpoint_id: int, uid: str, subtask: int) -> SnapshotTarget:
        """Where operator ``uid``'s instance ``subtask`` writes snapshot ``checkpoint_id``.

        Raises :class:`~aiostream_ckpt.errors.CheckpointError` when the storage
        cannot take it (full, gone): the task then declines.
        """
        ...

    def acknowledge(self, checkpoint_id: int, ack: TaskAck) -> None:
        """Report the task's snapshot of ``checkpoint_id`` written: its states, sizes, timings."""
        ...

    def decline(self, checkpoint_id: int, task_id: str, reason: BaseException) -> None:
        """Report that the task cannot take ``checkpoint_id``: it is aborted, the job goes on."""
        ...


class TaskCoordinator(CheckpointResponder, Protocol):
    """All a task sees of the coordinator: the responder, its registration, the job's end.

    The :class:`~aiostream_ckpt.checkpoint.coordinator.CheckpointCoordinator`
    in a single process; in a worker process, its proxy over the control
    connection (``runtime.workers.worker_attempt``): the task cannot tell them apart.
    """

    #: resolves to the id of the checkpoint taken after every source ended
    finished: asyncio.Future[int]

    def register_task(self, task_id: str, listener: CheckpointListener) -> None: ...

    def register_source(self, task_id: str, source: TriggerTarget) -> None: ...

    def source_finished(self, task_id: str) -> None:
        """Note that source task ``task_id`` read its input to the end."""
        ...
