"""What the coordinator sees of the tasks: sources it triggers, tasks it notifies.

The two directions of the checkpoint protocol each have one seam. Tasks answer
the coordinator through :class:`~aiostream_ckpt.checkpoint.responder.CheckpointResponder`;
the coordinator reaches tasks only through the protocols here (Flink's
``CheckpointableTask.triggerCheckpointAsync`` and ``CheckpointListener``).
Keeping them out of the coordinator lets a task, a remote-task proxy or a
test fake implement them without importing the coordinator.
"""

from __future__ import annotations

from typing import Protocol

from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier
from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint


class TriggerTarget(Protocol):
    """A source task: injects barrier n into its outputs when asked."""

    def trigger_checkpoint(self, barrier: CheckpointBarrier) -> None: ...


class CheckpointListener(Protocol):
    """A task told the fate of checkpoint n: complete (sinks commit) or aborted."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None: ...

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None: ...


class CheckpointCommitter(Protocol):
    """A sink's global committer, run by the coordinator when checkpoint n is complete.

    Called after n's metadata is durable and before any task is notified, one
    at a time, in checkpoint order (see ``connectors.base.GlobalCommitter``).
    A failure fails the job over: the restore of n commits it again.
    """

    name: str

    async def commit_checkpoint(self, completed: CompletedCheckpoint) -> None: ...
