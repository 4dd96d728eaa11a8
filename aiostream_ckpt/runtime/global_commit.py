"""The sinks' global committers of one attempt, where the coordinator runs.

A sink that commits once for all its subtasks (a Delta table: one commit per
checkpoint, :class:`~aiostream_ckpt.connectors.base.GlobalCommitter`) has its
committer here, in the main process, whatever processes run its subtasks:
the writers' states reach the coordinator in their acknowledgements, so
the completed checkpoint's metadata lists everything to commit. The
coordinator runs each committer once a checkpoint's metadata is durable,
before any task hears of it; the restore runs their survey with the
writers' (step 3 of ``runtime.failover.recovery``) and their recovery before the
writers' (step 5), so a writer recovering finds the table as the restored
checkpoint says it is.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from typing import Any

from aiostream_ckpt.checkpoint.coordinator import CheckpointCoordinator
from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.connectors.base import (
    ConnectorContext,
    GlobalCommitSink,
    GlobalCommitter,
    OutputSurvey,
    RestoreInfo,
)
from aiostream_ckpt.jobspec.graph import JobSpec, TransformKind
from aiostream_ckpt.runtime.subtask_checkpoint import WRITER_KEY
from aiostream_ckpt.runtime.writer_state import old_states


class SinkCommitter:
    """One sink's committer, as the coordinator's ``CheckpointCommitter``."""

    def __init__(self, uid: str, committer: GlobalCommitter) -> None:
        self.uid = uid
        self.name = f"sink {uid!r}"
        self.committer = committer

    def states(self, checkpoint: CompletedCheckpoint | None) -> dict[int, dict[str, Any]]:
        """Return the writer states ``checkpoint`` holds for this sink, by subtask."""
        return {} if checkpoint is None else old_states(checkpoint, self.uid, WRITER_KEY)

    async def commit_checkpoint(self, completed: CompletedCheckpoint) -> None:
        await self.committer.commit(completed.checkpoint_id, self.states(completed))


class GlobalCommitters:
    """The committers of every :class:`GlobalCommitSink` of a job, for one attempt."""

    def __init__(
        self,
        spec: JobSpec,
        *,
        attempt: int,
        restore: RestoreInfo | None,
        executor: Executor,
    ) -> None:
        self._executor = executor
        self.committers: list[SinkCommitter] = []
        for t in spec.transformations:
            if t.kind is TransformKind.SINK and isinstance(t.fn, GlobalCommitSink):
                ctx = ConnectorContext(
                    job_name=spec.job_name,
                    operator_uid=t.uid,
                    subtask_index=0,
                    parallelism=t.parallelism,
                    attempt=attempt,
                    restore=restore,
                    executor=executor,
                )
                self.committers.append(SinkCommitter(t.uid, t.fn.create_committer(ctx)))

    def register(self, coordinator: CheckpointCoordinator) -> None:
        for c in self.committers:
            coordinator.register_committer(c)

    async def surveys(
        self, restored: CompletedCheckpoint | None, checkpoint_id: int | None
    ) -> list[OutputSurvey]:
        """Survey every committer's output (read-only; blocking reads in the attempt's threads)."""
        loop = asyncio.get_running_loop()
        return [
            await loop.run_in_executor(
                self._executor, c.committer.survey, c.states(restored), checkpoint_id
            )
            for c in self.committers
        ]

    async def recover(
        self, restored: CompletedCheckpoint | None, checkpoint_id: int | None
    ) -> None:
        for c in self.committers:
            await c.committer.recover(c.states(restored), checkpoint_id)

    async def close(self) -> None:
        for c in self.committers:
            await c.committer.close()


def recover_checkpoint_id(restored: CompletedCheckpoint | None, *, fallback: bool) -> int | None:
    """Return the id writers recover to: the restored one, 0 after a fallback, else None."""
    if restored is not None:
        return restored.checkpoint_id
    return 0 if fallback else None
