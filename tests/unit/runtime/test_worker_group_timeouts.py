"""A worker alive but silent in its restore fails the attempt after job.worker_start_timeout.

The main process waits for every worker's reply to ``attempt`` (restore
state, survey outputs) and to ``recover``. A worker that dies ends the wait
(its control connection's end); one that hangs -- a user ``open()`` that
never returns, a stopped process -- keeps its connection open, and before
this the wait, and so the job, never ended. The workers here are the far
ends of socket pairs that never answer; the clock is a ManualClock.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aiostream_ckpt.checkpoint.storage import CheckpointStorage
from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.errors import WorkerError
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.runtime.attempt import AttemptSetup
from aiostream_ckpt.runtime.remote import ChannelConnection
from aiostream_ckpt.runtime.wire import batch_codec
from aiostream_ckpt.runtime.worker_group import WorkerGroup
from aiostream_ckpt.runtime.workers import WorkerLaunch, WorkerState
from tests.helpers import job_coordinator

TIMEOUT = 30.0


class Workers:
    """A group of two workers whose processes are socket ends under the test's control."""

    def __init__(self, group: WorkerGroup, ends: list[ChannelConnection], clock: ManualClock):
        self.group, self.ends, self.clock = group, ends, clock

    def reply(self, worker: int, message: dict[str, object]) -> None:
        self.ends[worker].send_message(message)

    async def expire(self, waiting: Awaitable[object]) -> asyncio.Future[object]:
        """Start ``waiting``, let it block, then move the clock past the timeout."""
        fut = asyncio.ensure_future(waiting)
        for _ in range(50):
            await asyncio.sleep(0)
        assert not fut.done()
        self.clock.advance(TIMEOUT - 0.1)
        for _ in range(20):
            await asyncio.sleep(0)
        assert not fut.done(), "no timeout before job.worker_start_timeout"
        self.clock.advance(0.2)
        await asyncio.wait([fut], timeout=10)
        assert fut.done()
        return fut


@pytest.fixture
async def workers(tmp_path: Path) -> AsyncIterator[Workers]:
    storage = CheckpointStorage(tmp_path / "ckpt")
    clock = ManualClock()
    with ThreadPoolExecutor(max_workers=1) as executor:
        coordinator = job_coordinator(storage, clock, executor)
        launch = WorkerLaunch("apps.pv_count", None, (), 2)
        group = WorkerGroup(
            launch, [], [], coordinator, storage, start_timeout=TIMEOUT, clock=clock
        )
        ends: list[ChannelConnection] = []
        for w in group.workers:
            ours, theirs = socket.socketpair()
            await w.control.start(ours)
            w.state = WorkerState.READY
            ends.append(ChannelConnection(f"worker-{w.index}", batch_codec()))
            await ends[-1].start(theirs)
            group._bg.spawn(group._pump(w), f"worker-{w.index}-control")
        try:
            yield Workers(group, ends, clock)
        finally:
            await group.stop()
            for conn in ends:
                await conn.close()


def setup(tmp_path: Path) -> AttemptSetup:
    return AttemptSetup(
        job_name="pv_count",
        config=JobConfig(),
        params={},
        clock=ManualClock(),
        attempt=0,
        restored=None,
        restore=None,
        fallback=False,
        local_dir=tmp_path / "local",
    )


async def test_a_worker_silent_in_its_restore_is_killed_and_named(
    tmp_path: Path, workers: Workers
) -> None:
    workers.reply(0, {"type": "surveys", "surveys": []})  # worker 0 restored; 1 hangs
    fut = await workers.expire(workers.group.restore(setup(tmp_path)))
    exc = fut.exception()
    assert isinstance(exc, WorkerError) and exc.retriable
    assert "worker 1" in str(exc) and "worker 0" not in str(exc)
    assert "did not restore its state within 30s (job.worker_start_timeout)" in str(exc)
    assert workers.group.workers[1].state is WorkerState.FAILED  # killed, not left to a stop
    assert workers.group.workers[0].state is WorkerState.READY
    assert workers.group.failure.done()


async def test_a_worker_silent_in_its_outputs_recovery_is_killed_and_named(
    tmp_path: Path, workers: Workers
) -> None:
    workers.reply(1, {"type": "recovered"})
    fut = await workers.expire(workers.group.recover())
    exc = fut.exception()
    assert isinstance(exc, WorkerError)
    assert "worker 0" in str(exc) and "did not recover its outputs within 30s" in str(exc)
    assert workers.group.workers[0].state is WorkerState.FAILED


async def test_workers_that_answer_in_time_are_not_timed_out(
    tmp_path: Path, workers: Workers
) -> None:
    restore = asyncio.ensure_future(workers.group.restore(setup(tmp_path)))
    workers.clock.advance(TIMEOUT - 1)
    for i in (0, 1):
        workers.reply(i, {"type": "surveys", "surveys": []})
    assert await asyncio.wait_for(restore, 10) == []
    workers.clock.advance(10 * TIMEOUT)  # the deadline of a finished step is gone
    for _ in range(20):
        await asyncio.sleep(0)
    assert not workers.group.failure.done()
