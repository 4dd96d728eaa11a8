"""CheckpointCoordinator knobs, driven by a ManualClock (no sleeping)."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aiostream_ckpt.checkpoint import coordinator as coordinator_module
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier
from aiostream_ckpt.checkpoint.config import CheckpointConfig
from aiostream_ckpt.checkpoint.coordinator import CheckpointCoordinator
from aiostream_ckpt.checkpoint.metadata import TaskAck
from aiostream_ckpt.checkpoint.storage import CheckpointStorage, read_checkpoint
from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.errors import CheckpointError


class FakeTask:
    """A source task that records triggers and notifications."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.triggered: list[int] = []
        self.completed: list[int] = []
        self.aborted: list[int] = []

    def trigger_checkpoint(self, barrier: CheckpointBarrier) -> None:
        self.triggered.append(barrier.checkpoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.completed.append(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.aborted.append(checkpoint_id)


def ack(task: FakeTask, cid: int) -> TaskAck:
    states = {"src": {"subtask": 0, "parallelism": 1, "operator": {"positions": {"p": cid}}}}
    return TaskAck(task.task_id, states, 0.001, 0.002, 0.0, 10)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture
def executor():
    with ThreadPoolExecutor(1) as ex:
        yield ex


def make(
    tmp_path: Path, executor, clock: ManualClock, **knobs
) -> tuple[CheckpointCoordinator, FakeTask]:
    config = CheckpointConfig(directory=tmp_path, **knobs)
    coord = CheckpointCoordinator(
        job_name="t",
        config=config,
        storage=CheckpointStorage(tmp_path),
        clock=clock,
        executor=executor,
        max_parallelism=128,
        first_checkpoint_id=1,
    )
    task = FakeTask("src-0")
    coord.register_task(task.task_id, task)
    coord.register_source(task.task_id, task)
    return coord, task


async def complete(coord: CheckpointCoordinator, task: FakeTask, cid: int) -> None:
    coord.acknowledge(cid, ack(task, cid))
    for _ in range(200):
        if cid in task.completed or cid in task.aborted:
            return
        await asyncio.sleep(0.001)  # the metadata write runs in the executor thread
    raise AssertionError(f"checkpoint {cid} did not complete")


async def test_periodic_trigger_and_durable_metadata(tmp_path, executor) -> None:
    clock = ManualClock()
    coord, task = make(tmp_path, executor, clock, interval=1.0)
    async with coord:
        await settle()
        assert task.triggered == []
        clock.advance(1.0)
        await settle()
        assert task.triggered == [1]
        await complete(coord, task, 1)
        chk = read_checkpoint(tmp_path / "chk-0000000001")
        assert chk.subtask_states("src")[0]["operator"] == {"positions": {"p": 1}}
        clock.advance(1.0)
        await settle()
        assert task.triggered == [1, 2]


async def test_timeout_expires_and_discards(tmp_path, executor) -> None:
    clock = ManualClock()
    coord, task = make(tmp_path, executor, clock, interval=0, timeout=5.0, tolerable_failures=5)
    async with coord:
        fut = coord.trigger()
        coord.snapshot_target(1, "op", 0)  # a task started writing files
        assert (tmp_path / "chk-0000000001").exists()
        clock.advance(4.9)
        await settle()
        assert not fut.done()
        clock.advance(0.2)
        await settle()
        with pytest.raises(CheckpointError, match="expired"):
            fut.result()
        assert task.aborted == [1]
        assert not (tmp_path / "chk-0000000001").exists()
        coord.acknowledge(1, ack(task, 1))  # a late ack is ignored
        await settle()
        assert task.completed == []


async def test_max_concurrent_holds_back_triggers(tmp_path, executor) -> None:
    clock = ManualClock()
    coord, task = make(tmp_path, executor, clock, interval=1.0, max_concurrent=1, timeout=100)
    async with coord:
        clock.advance(1.0)
        await settle()
        clock.advance(3.0)
        await settle()
        assert task.triggered == [1], "no second checkpoint while one is pending"
        await complete(coord, task, 1)
        await settle()
        assert task.triggered == [1, 2]


async def test_min_pause_between_checkpoints(tmp_path, executor) -> None:
    clock = ManualClock()
    coord, task = make(tmp_path, executor, clock, interval=1.0, min_pause=2.5, timeout=100)
    async with coord:
        clock.advance(1.0)
        await settle()
        await complete(coord, task, 1)
        clock.advance(1.0)  # interval passed, min pause not
        await settle()
        assert task.triggered == [1]
        clock.advance(1.4)
        await settle()
        assert task.triggered == [1]
        clock.advance(0.2)
        await settle()
        assert task.triggered == [1, 2]


async def test_tolerable_failures_then_job_fails(tmp_path, executor) -> None:
    clock = ManualClock()
    coord, task = make(tmp_path, executor, clock, interval=0, tolerable_failures=2)
    async with coord:
        for cid in (1, 2, 3):
            coord.trigger()
            coord.decline(cid, task.task_id, RuntimeError("disk full"))
            await settle()
            assert coord.failure.done() == (cid == 3)
        assert "exceed tolerable_failures=2" in str(coord.failure.result())


async def test_success_resets_failure_count(tmp_path, executor) -> None:
    clock = ManualClock()
    coord, task = make(tmp_path, executor, clock, interval=0, tolerable_failures=1)
    async with coord:
        coord.trigger()
        coord.decline(1, task.task_id, RuntimeError("x"))
        coord.trigger()
        await complete(coord, task, 2)
        coord.trigger()
        coord.decline(3, task.task_id, RuntimeError("x"))
        await settle()
        assert not coord.failure.done()


async def test_retention_keeps_newest(tmp_path, executor) -> None:
    clock = ManualClock()
    coord, task = make(tmp_path, executor, clock, interval=0, retained=2)
    async with coord:
        for cid in (1, 2, 3, 4):
            coord.trigger()
            await complete(coord, task, cid)
            clock.advance(1)
        await _wait_for(lambda: len(list(tmp_path.glob("chk-*"))) == 2)
    kept = sorted(p.name for p in tmp_path.glob("chk-*"))
    assert kept == ["chk-0000000003", "chk-0000000004"]


async def test_completed_checkpoints_leave_no_memory_behind(tmp_path, executor) -> None:
    """A long-running job's coordinator holds nothing per ended checkpoint.

    It used to keep its own 1000-entry history, never read, beside the REST
    API's (~465 bytes a checkpoint for the first 1000: at 1 s checkpoints the
    soak's RSS slope for 17 minutes, bench/README.md), and each checkpoint's
    timeout task slept out the whole timeout after the checkpoint ended.
    """
    clock = ManualClock()
    coord, task = make(tmp_path, executor, clock, interval=0, retained=2, timeout=3600.0)
    seen: list[int] = []
    coord.on_history = lambda entry: seen.append(entry["id"])  # the listener still hears all
    only_coordinator = [tracemalloc.Filter(True, coordinator_module.__file__)]

    async def run(cids: range) -> int:
        for cid in cids:
            coord.trigger()
            coord.acknowledge(cid, ack(task, cid))
            await _wait_for(lambda c=cid: c in task.completed, patience=10_000)
            clock.advance(1)
        await settle()
        gc.collect()
        snap = tracemalloc.take_snapshot().filter_traces(only_coordinator)
        return sum(s.size for s in snap.statistics("filename"))

    tracemalloc.start()
    try:
        async with coord:
            warm = await run(range(1, 11))
            later = await run(range(11, 111))
    finally:
        tracemalloc.stop()
    assert seen == list(range(1, 111))
    assert clock.sleepers == 0  # no timeout outlives its checkpoint
    # before: ~+70 kB over these 100 checkpoints; now only what the newest ones hold
    assert later - warm < 3_000, (warm, later)


async def _wait_for(predicate, patience: int = 1000) -> None:
    for _ in range(patience):
        if predicate():
            return
        await asyncio.sleep(0.001)  # retention runs in the executor thread
    raise AssertionError("condition not reached")


async def test_final_checkpoint_after_all_sources_finished(tmp_path, executor) -> None:
    clock = ManualClock()
    coord, task = make(tmp_path, executor, clock, interval=0)
    async with coord:
        coord.source_finished(task.task_id)
        assert task.triggered == [1]
        await complete(coord, task, 1)
        assert coord.finished.done() and coord.finished.result() == 1
        assert read_checkpoint(tmp_path / "chk-0000000001").is_final
