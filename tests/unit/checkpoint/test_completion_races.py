"""A checkpoint whose metadata is being written either completes or was never durable.

The metadata write runs in an executor thread. An abort that lands while it
runs (a newer checkpoint completing, the timeout, the job stopping) must not
leave a checkpoint that the coordinator and the tasks think aborted -- its
shared files unpinned, its transactions rolled back -- but whose metadata is
on disk for the next run to restore. Each test holds one metadata write in its
thread at a gate and lands the abort meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aiostream_ckpt.checkpoint.config import CheckpointConfig
from aiostream_ckpt.checkpoint.coordinator import CheckpointCoordinator
from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.checkpoint.storage import CheckpointStorage
from aiostream_ckpt.clock import ManualClock
from tests.unit.checkpoint.test_coordinator import FakeTask, ack, settle


class GatedStorage(CheckpointStorage):
    """Holds the metadata write of checkpoint ``held`` until :attr:`gate` opens."""

    def __init__(self, root: Path, held: int) -> None:
        super().__init__(root)
        self.held = held
        self.entered = threading.Event()
        self.gate = threading.Event()

    def write_completed(self, completed: CompletedCheckpoint) -> None:
        if completed.checkpoint_id == self.held:
            self.entered.set()
            assert self.gate.wait(10), "the test never opened the gate"
        super().write_completed(completed)


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as ex:  # as the job runner: two writes may run at once
        yield ex


def make(
    tmp_path: Path, executor: ThreadPoolExecutor, clock: ManualClock, **knobs: object
) -> tuple[CheckpointCoordinator, FakeTask, GatedStorage]:
    storage = GatedStorage(tmp_path, held=1)
    coord = CheckpointCoordinator(
        job_name="t",
        config=CheckpointConfig(directory=tmp_path, **knobs),  # type: ignore[arg-type]
        storage=storage,
        clock=clock,
        executor=executor,
        max_parallelism=128,
        first_checkpoint_id=1,
    )
    task = FakeTask("src-0")
    coord.register_task(task.task_id, task)
    coord.register_source(task.task_id, task)
    return coord, task, storage


async def until(predicate, what: str) -> None:
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.001)  # waits on executor threads, not on time
    raise AssertionError(f"never: {what}")


def durable(storage: CheckpointStorage) -> set[int]:
    return set(storage.completed_newest_first())


def assert_consistent(storage: CheckpointStorage, task: FakeTask) -> None:
    on_disk = durable(storage)
    assert not on_disk & set(task.aborted), (
        f"checkpoints {sorted(on_disk & set(task.aborted))} were aborted (pins dropped, "
        "transactions rolled back) but their metadata is durable"
    )


async def test_newer_checkpoint_completing_during_the_write(tmp_path, executor) -> None:
    coord, task, storage = make(tmp_path, executor, ManualClock(), interval=0, retained=1)
    async with coord:
        coord.trigger()
        coord.trigger()
        coord.acknowledge(1, ack(task, 1))
        await until(storage.entered.is_set, "checkpoint 1's metadata write started")
        coord.acknowledge(2, ack(task, 2))
        await settle()
        # one worker is held at the gate: a no-op on the other runs after any write of 2
        await asyncio.get_running_loop().run_in_executor(executor, lambda: None)
        await settle()
        storage.gate.set()
        await until(lambda: 2 in task.completed, "checkpoint 2 completed")
        await until(lambda: durable(storage) == {2}, "retention kept only checkpoint 2")
    assert_consistent(storage, task)
    assert task.completed == [1, 2]


async def test_timeout_during_the_write(tmp_path, executor) -> None:
    clock = ManualClock()
    coord, task, storage = make(tmp_path, executor, clock, interval=0, timeout=5.0)
    async with coord:
        coord.trigger()
        coord.acknowledge(1, ack(task, 1))
        await until(storage.entered.is_set, "checkpoint 1's metadata write started")
        clock.advance(6.0)
        await settle()
        storage.gate.set()
        await until(lambda: task.completed or task.aborted, "checkpoint 1 decided")
    assert_consistent(storage, task)
    assert task.completed == [1], "every task acknowledged: only the write was left"


async def test_job_stopping_during_the_write(tmp_path, executor) -> None:
    coord, task, storage = make(tmp_path, executor, ManualClock(), interval=0)
    await coord.start()
    coord.trigger()
    coord.acknowledge(1, ack(task, 1))
    await until(storage.entered.is_set, "checkpoint 1's metadata write started")
    stopping = asyncio.create_task(coord.stop())
    await settle()
    storage.gate.set()
    await stopping
    executor.shutdown(wait=True)  # a write left running in its thread has landed now
    assert_consistent(storage, task)
    assert durable(storage) == {1}, "the write finished: the checkpoint is complete"
