"""How a task answers the coordinator about checkpoint n (Flink's ``CheckpointResponder``).

The task's side of the protocol sees only this: where to write its keyed
state, then one acknowledgement or one decline per checkpoint. The
:class:`~aiostream_ckpt.checkpoint.coordinator.CheckpointCoordinator` is the
implementation; tests can put a recorder in its place.
"""

from __future__ import annotations

from typing import Protocol

from aiostream_ckpt.checkpoint.metadata import TaskAck
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
