"""The main process's graces for its workers run on the injected clock.

``WorkerGroup.stop`` asks every worker to stop and kills one still running
after ``STOP_GRACE_SECONDS``; a worker's exit fails the attempt after
``EXIT_GRACE_SECONDS`` if its connection has not ended first. Both waited on
real time (``asyncio.wait_for``, ``asyncio.wait(timeout=)``), so no test
could reach them without sleeping 30 s. The workers here are real processes
(``tests/apps/stub_worker.py``); only the clock is a ManualClock.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from aiostream_ckpt.checkpoint.storage import CheckpointStorage
from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.errors import WorkerError
from aiostream_ckpt.runtime.network.placement import graph_fingerprint
from aiostream_ckpt.runtime.workers.worker_group import (
    EXIT_GRACE_SECONDS,
    STOP_GRACE_SECONDS,
    WorkerGroup,
)
from aiostream_ckpt.runtime.workers.worker_process import WorkerLaunch, WorkerState
from tests.helpers import REPO, gone, job_coordinator

STUB = REPO / "tests" / "apps" / "stub_worker.py"


@dataclass(frozen=True)
class StubLaunch(WorkerLaunch):
    """Workers that run ``stub_worker.py`` in ``mode`` instead of the job."""

    mode: str = "stubborn"

    def argv(
        self, index: int, control_fd: int, peer_fds: dict[int, int] | None = None
    ) -> list[str]:
        return [sys.executable, str(STUB), self.mode, str(control_fd), graph_fingerprint([])]


async def settle(clock: ManualClock, sleepers: int) -> None:
    """Run the loop (real time: the processes run) until ``sleepers`` wait on the clock."""
    for _ in range(2000):
        if clock.sleepers >= sleepers:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{clock.sleepers} sleepers on the clock, expected {sleepers}")


@pytest.fixture
async def clock() -> ManualClock:
    return ManualClock()


async def started_group(
    tmp_path: Path, clock: ManualClock, mode: str
) -> AsyncIterator[WorkerGroup]:
    storage = CheckpointStorage(tmp_path / "ckpt")
    with ThreadPoolExecutor(max_workers=1) as executor:
        coordinator = job_coordinator(storage, clock, executor)
        launch = StubLaunch("stub", None, (), 2, mode=mode)
        group = WorkerGroup(launch, [], [], coordinator, storage, clock=clock)
        try:
            await asyncio.wait_for(group.start(), 60)
            yield group
        finally:
            for w in group.workers:  # whatever the test left running
                await w.kill()


@pytest.fixture
async def stubborn(tmp_path: Path, clock: ManualClock) -> AsyncIterator[WorkerGroup]:
    async for group in started_group(tmp_path, clock, "stubborn"):
        yield group


@pytest.fixture
async def forking(tmp_path: Path, clock: ManualClock) -> AsyncIterator[WorkerGroup]:
    async for group in started_group(tmp_path, clock, "forks"):
        yield group


async def test_a_worker_that_does_not_stop_is_killed_after_the_stop_grace(
    stubborn: WorkerGroup, clock: ManualClock
) -> None:
    """The workers ignore the stop, the end of their connection and SIGTERM."""
    pids = [w.pid for w in stubborn.workers]
    assert all(pid is not None for pid in pids)
    stop = asyncio.ensure_future(stubborn.stop())
    await settle(clock, len(pids))  # one stop grace per worker
    clock.advance(STOP_GRACE_SECONDS - 0.1)
    await asyncio.sleep(0.2)  # real time for a kill to land, were one sent early
    assert not stop.done(), "killed before the stop grace"
    assert not any(gone(pid) for pid in pids if pid is not None)
    clock.advance(0.2)
    await asyncio.wait_for(stop, 30)
    assert all(w.state is WorkerState.FAILED for w in stubborn.workers)
    assert [await w.exited() for w in stubborn.workers] == [-9, -9]


async def test_an_exit_with_the_socket_held_fails_the_attempt_after_the_exit_grace(
    forking: WorkerGroup, clock: ManualClock
) -> None:
    """A worker exits; the child it forked keeps its control socket open (no end of file)."""
    await asyncio.wait_for(asyncio.gather(*(w.exited() for w in forking.workers)), 30)
    await settle(clock, len(forking.workers))  # each exit's grace for the connection's end
    clock.advance(EXIT_GRACE_SECONDS - 0.05)
    for _ in range(50):
        await asyncio.sleep(0)
    assert not forking.failure.done(), "failed before the exit grace"
    clock.advance(0.1)
    failure = await asyncio.wait_for(asyncio.shield(forking.failure), 10)
    assert isinstance(failure, WorkerError) and failure.retriable
    assert "exited with code 0" in str(failure)
    await forking.stop()  # closes the connections: the children holding them exit
