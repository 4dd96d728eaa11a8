"""A task cancelled in the step its record loop failed still collects the loop's error.

A worker stopping while a peer worker exits first is the case: the source's
send fails ("peer process is gone") in the same loop step as the task is
cancelled; the error must be retrieved, not logged as never retrieved.
"""

from __future__ import annotations

import asyncio
import gc
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from aiostream_ckpt.checkpoint.metadata import TaskAck
from aiostream_ckpt.clock import SystemClock
from aiostream_ckpt.errors import ChannelError
from aiostream_ckpt.runtime.chain import ChainSpec
from aiostream_ckpt.runtime.task import StreamTask
from aiostream_ckpt.state.backend import SnapshotTarget


class Coordinator:
    """Just enough of the TaskCoordinator for a task that never checkpoints."""

    def __init__(self) -> None:
        self.finished: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def register_task(self, task_id: str, listener: Any) -> None:
        pass

    def register_source(self, task_id: str, source: Any) -> None:
        pass

    def source_finished(self, task_id: str) -> None:
        pass

    def snapshot_target(self, checkpoint_id: int, uid: str, subtask: int) -> SnapshotTarget:
        raise AssertionError("no checkpoint is taken")

    def acknowledge(self, checkpoint_id: int, ack: TaskAck) -> None:
        raise AssertionError("no checkpoint is taken")

    def decline(self, checkpoint_id: int, task_id: str, reason: BaseException) -> None:
        raise AssertionError("no checkpoint is taken")


class FailingReader:
    """Its first read cancels the running task, then fails, in the same loop step."""

    def __init__(self) -> None:
        self.runner: asyncio.Task[None] | None = None

    async def start(self, restored: dict[str, Any] | None) -> None:
        pass

    async def read_batch(self, max_records: int) -> list[Any] | None:
        assert self.runner is not None
        self.runner.cancel()
        raise ChannelError("connection worker-1-0: the peer process is gone")

    def snapshot_position(self) -> dict[str, Any]:
        return {}

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        pass

    async def close(self) -> None:
        pass


async def _run_and_cancel() -> list[dict[str, Any]]:
    unretrieved: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, ctx: unretrieved.append(ctx))
    reader = FailingReader()
    spec = ChainSpec(task_id="src-0", subtask=0, parallelism=1, operators=[], reader=reader)
    with ThreadPoolExecutor(1) as executor:
        task = StreamTask(
            spec,
            coordinator=Coordinator(),
            executor=executor,
            clock=SystemClock(),
            batch_size=8,
            params={},
            restored=None,
        )
        reader.runner = asyncio.create_task(task.run())
        with pytest.raises(asyncio.CancelledError):
            await reader.runner
    reader.runner = None
    del task
    gc.collect()  # a task whose error nobody retrieved reports it when collected
    await asyncio.sleep(0)
    return unretrieved


def test_a_cancelled_task_retrieves_its_failed_record_loop() -> None:
    unretrieved = asyncio.run(_run_and_cancel())
    assert [c["message"] for c in unretrieved] == []
