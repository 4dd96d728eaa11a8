"""An aborted checkpoint or savepoint leaves no directory behind, whenever its tasks write.

The abort removes ``chk-N`` (a savepoint's caller removes its directory). But
a task reaches n's barrier late, or finishes its asynchronous write after
the abort: before this, its files re-created ``chk-N/<uid>-<subtask>`` (or the
savepoint's directory, or -- in a worker, once told of the abort -- a
``chk-N`` of the savepoint's id), left there until the next attempt's
cleanup. Now a target of an ended checkpoint is refused (the task declines;
a worker's in ``tests/unit/runtime/workers/test_worker_savepoint_dirs.py``),
and a late ack or decline removes what the late write made, never a
completed checkpoint's or savepoint's files. ManualClock; no sleeping.
"""

from __future__ import annotations

import asyncio
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aiostream_ckpt.checkpoint.coordinator import CheckpointCoordinator
from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.errors import CheckpointError
from tests.unit.checkpoint.test_coordinator import FakeTask, ack, complete, settle
from tests.unit.checkpoint.test_coordinator import make as make_coordinator

TIMEOUT = 5.0


@pytest.fixture
def executor():
    with ThreadPoolExecutor(1) as ex:
        yield ex


def make(tmp_path: Path, executor, clock: ManualClock) -> tuple[CheckpointCoordinator, FakeTask]:
    """One source task; checkpoints in ``tmp_path/ckpt``, savepoints beside it."""
    knobs = {"interval": 0, "timeout": TIMEOUT, "tolerable_failures": 9}
    return make_coordinator(tmp_path / "ckpt", executor, clock, **knobs)


async def expire(clock: ManualClock, fut: asyncio.Future[object]) -> None:
    clock.advance(TIMEOUT + 0.1)
    await settle()
    with pytest.raises(CheckpointError, match="expired"):
        fut.result()


def write_late(target_dir: Path) -> None:
    """What a snapshot writer does after the abort (lmdb mkdirs its output directory)."""
    target_dir.mkdir(parents=True, exist_ok=True)
    (target_dir / "state.bin").write_bytes(b"x")


async def test_a_late_task_gets_no_target_of_an_aborted_savepoint(tmp_path, executor) -> None:
    clock = ManualClock()
    coord, _ = make(tmp_path, executor, clock)
    sp = tmp_path / "savepoints" / "sp-1"
    sp.mkdir(parents=True)
    async with coord:
        fut = coord.trigger(savepoint_dir=sp)
        await expire(clock, fut)
        shutil.rmtree(sp)  # the savepoint's caller removes it (SavepointService)
        with pytest.raises(CheckpointError, match="checkpoint 1 has ended"):
            coord.snapshot_target(1, "op", 0)  # the task declines instead
    assert not sp.exists()
    assert not (tmp_path / "ckpt" / "chk-0000000001").exists()


@pytest.mark.parametrize("savepoint", [False, True])
async def test_a_late_write_is_removed_when_its_ack_comes(
    tmp_path, executor, savepoint: bool
) -> None:
    clock = ManualClock()
    coord, task = make(tmp_path, executor, clock)
    sp = tmp_path / "savepoints" / "sp-1"
    if savepoint:
        sp.mkdir(parents=True)
    chk1 = tmp_path / "ckpt" / "chk-0000000001"
    async with coord:
        fut = coord.trigger(savepoint_dir=sp if savepoint else None)
        target = coord.snapshot_target(1, "op", 0)  # taken in time...
        await expire(clock, fut)
        if savepoint:
            shutil.rmtree(sp)
        assert not chk1.exists() and not sp.exists()
        write_late(target.exclusive_dir)  # ...written after the abort
        coord.acknowledge(1, ack(task, 1))
        await settle()
    assert not chk1.exists()
    assert not sp.exists()
    assert task.completed == []


async def test_a_late_decline_removes_the_late_write_too(tmp_path, executor) -> None:
    clock = ManualClock()
    coord, task = make(tmp_path, executor, clock)
    async with coord:
        fut = coord.trigger()
        target = coord.snapshot_target(1, "op", 0)
        await expire(clock, fut)
        write_late(target.exclusive_dir)
        coord.decline(1, task.task_id, CheckpointError("its write failed"))
    assert not (tmp_path / "ckpt" / "chk-0000000001").exists()


async def test_completed_checkpoints_and_savepoints_are_never_removed(tmp_path, executor) -> None:
    clock = ManualClock()
    coord, task = make(tmp_path, executor, clock)
    sp = tmp_path / "savepoints" / "sp-2"
    sp.mkdir(parents=True)
    async with coord:
        coord.trigger()
        coord.snapshot_target(1, "op", 0)
        await complete(coord, task, 1)
        saved = coord.trigger(savepoint_dir=sp)
        coord.snapshot_target(2, "op", 0)
        coord.acknowledge(2, ack(task, 2))
        await asyncio.wait_for(saved, 10)
        for cid in (1, 2):  # a stray ack or decline of a completed one
            coord.acknowledge(cid, ack(task, cid))
            coord.decline(cid, task.task_id, CheckpointError("late"))
        await settle()
    assert (tmp_path / "ckpt" / "chk-0000000001" / "_metadata").exists()
    assert (tmp_path / "ckpt" / "chk-0000000001" / "op-0").is_dir()
    assert (sp / "_metadata").exists() and (sp / "op-0").is_dir()
