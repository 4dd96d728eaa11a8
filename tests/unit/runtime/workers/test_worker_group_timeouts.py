"""A worker alive but silent fails the attempt: job.worker_*_timeout, job.heartbeat_timeout.

The main process waits for every worker's reply to ``attempt`` (restore
state, survey outputs) and to ``recover``. A worker that dies ends the wait
(its control connection's end); one that hangs -- a user ``open()`` that
never returns, a stopped process -- keeps its connection open, and before
this the wait, and so the job, never ended. Once the tasks run, a worker
that hangs is one whose heartbeats stop (``runtime.workers.heartbeats``): before
them only an expiring checkpoint failed the attempt (minutes), and nothing
did with checkpointing off. The workers here are the far ends of socket
pairs that answer only what the test sends; the clock is a ManualClock.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aiostream_ckpt.checkpoint.storage import CheckpointStorage
from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.daemon.config import load_config
from aiostream_ckpt.errors import ChannelError, ConfigError, WorkerError
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.runtime.network.remote import ChannelConnection
from aiostream_ckpt.runtime.wire import batch_codec
from aiostream_ckpt.runtime.workers.attempt import AttemptSetup
from aiostream_ckpt.runtime.workers.worker_group import WorkerGroup
from aiostream_ckpt.runtime.workers.worker_messages import error_message
from aiostream_ckpt.runtime.workers.worker_process import WorkerLaunch, WorkerState
from tests.helpers import job_coordinator

TIMEOUT = 30.0
HEARTBEAT_TIMEOUT = 5.0


class Workers:
    """A group of two workers whose processes are socket ends under the test's control."""

    def __init__(self, group: WorkerGroup, ends: list[ChannelConnection], clock: ManualClock):
        self.group, self.ends, self.clock = group, ends, clock

    def reply(self, worker: int, message: dict[str, object]) -> None:
        self.ends[worker].send_message(message)

    async def expire(
        self, waiting: Awaitable[object], bound: float = TIMEOUT
    ) -> asyncio.Future[object]:
        """Start ``waiting``, let it block, then move the clock past ``bound``."""
        fut = asyncio.ensure_future(waiting)
        for _ in range(50):
            await asyncio.sleep(0)
        assert not fut.done()
        self.clock.advance(bound - 0.1)
        for _ in range(20):
            await asyncio.sleep(0)
        assert not fut.done(), "no timeout before the step's timeout"
        self.clock.advance(0.2)
        await asyncio.wait([fut], timeout=10)
        assert fut.done()
        return fut


@pytest.fixture
async def workers(tmp_path: Path) -> AsyncIterator[Workers]:
    async with make_workers(tmp_path) as w:
        yield w


@contextlib.asynccontextmanager
async def make_workers(
    tmp_path: Path, restore_timeout: float | None = None
) -> AsyncIterator[Workers]:
    storage = CheckpointStorage(tmp_path / "ckpt")
    clock = ManualClock()
    with ThreadPoolExecutor(max_workers=1) as executor:
        coordinator = job_coordinator(storage, clock, executor)
        launch = WorkerLaunch("apps.pv_count", None, (), 2)
        group = WorkerGroup(
            launch,
            [],
            [],
            coordinator,
            storage,
            start_timeout=TIMEOUT,
            restore_timeout=restore_timeout,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            clock=clock,
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
    assert "did not restore its state within 30s (job.worker_restore_timeout)" in str(exc)
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


async def test_restore_and_recovery_have_their_own_bound_not_the_start_timeout(
    tmp_path: Path,
) -> None:
    """A short job.worker_restore_timeout, a long start timeout (a hello on a loaded machine).

    Old code: one job.worker_start_timeout bounded every step, so a test (or a
    user) that wanted a hang in the restore caught in 3 s had hellos cut at
    3 s too: on a loaded machine every attempt failed its hello.
    """
    async with make_workers(tmp_path, restore_timeout=3.0) as workers:
        group = workers.group
        assert (group.start_timeout, group.restore_timeout) == (TIMEOUT, 3.0)
        workers.reply(0, {"type": "surveys", "surveys": []})  # worker 1 hangs in its restore
        fut = await workers.expire(group.restore(setup(tmp_path)), bound=3.0)
        exc = fut.exception()
        assert isinstance(exc, WorkerError) and "worker 0" not in str(exc)
        said = "worker 1 (pid None) did not restore its state within 3s (job.worker_restore_t"
        assert said in str(exc)
    async with make_workers(tmp_path, restore_timeout=3.0) as workers:
        workers.reply(1, {"type": "recovered"})
        fut = await workers.expire(workers.group.recover(), bound=3.0)
        said = "worker 0 (pid None) did not recover its outputs within 3s (job.worker_restore_t"
        assert said in str(fut.exception())


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


async def turns(n: int = 30) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def beat(workers: Workers, *which: int) -> None:
    """Have the workers ``which`` send a heartbeat, and the group read it."""
    for i in which:
        workers.reply(i, {"type": "heartbeat", "lag": 0.25})
    await turns()


async def test_a_running_worker_unheard_for_the_heartbeat_timeout_is_killed_and_named(
    workers: Workers,
) -> None:
    group, clock = workers.group, workers.clock
    run = asyncio.ensure_future(group.run())
    await turns()
    for _ in range(4):  # both beat for a while; then worker 1 falls silent
        clock.advance(1.0)
        await beat(workers, 0, 1)
    for _ in range(4):
        clock.advance(1.0)
        await beat(workers, 0)
    clock.advance(0.9)  # worker 1 unheard for 4.9 s
    await turns()
    assert not group.failure.done(), "timed out before job.heartbeat_timeout"
    assert group.workers[1].state is WorkerState.READY
    clock.advance(0.2)
    await asyncio.wait_for(asyncio.shield(group.failure), 10)
    exc = group.failure.result()
    assert isinstance(exc, WorkerError) and exc.retriable
    assert "worker 1 (pid None) unheard for 5.1s" in str(exc) and "worker 0" not in str(exc)
    assert "no heartbeat within 5s (job.heartbeat_timeout): hung, killed" in str(exc)
    assert group.workers[1].state is WorkerState.FAILED  # killed, not left to a stop
    assert group.workers[0].state is WorkerState.READY
    with pytest.raises(WorkerError, match=r"job\.heartbeat_timeout"):
        await asyncio.wait_for(run, 10)


async def test_heartbeats_unread_when_the_timeout_is_due_still_count(workers: Workers) -> None:
    """The main process's loop was held up: the heartbeats wait in its sockets, unread."""
    group, clock = workers.group, workers.clock
    run = asyncio.ensure_future(group.run())
    await turns()
    clock.advance(HEARTBEAT_TIMEOUT - 0.5)
    await turns()
    for i in (0, 1):  # written to the sockets; the loop has not run since
        workers.reply(i, {"type": "heartbeat", "lag": 4.5})
    clock.advance(1.0)  # the watch is due first: both unheard for 5.5 s as it wakes
    await turns()
    assert not group.failure.done(), "failed workers whose heartbeats had arrived"
    assert group.heartbeats.max_lag(0) == 4.5
    clock.advance(HEARTBEAT_TIMEOUT)  # and the watch goes on
    await asyncio.wait_for(asyncio.shield(group.failure), 10)
    with pytest.raises(WorkerError, match=r"unheard for 5\.0s"):
        await asyncio.wait_for(run, 10)


async def test_heartbeats_keep_a_running_worker_alive(workers: Workers) -> None:
    group, clock = workers.group, workers.clock
    run = asyncio.ensure_future(group.run())
    await turns()
    for _ in range(40):  # 8 heartbeat timeouts
        clock.advance(1.0)
        await beat(workers, 0, 1)
    assert not group.failure.done()
    assert group.heartbeats.age(0) == 0.0
    assert group.heartbeats.max_lag(1) == 0.25
    for i in (0, 1):
        workers.reply(i, {"type": "done"})
    await asyncio.wait_for(run, 10)


async def test_silence_before_the_tasks_run_is_not_counted(
    tmp_path: Path, workers: Workers
) -> None:
    """Restoring is bounded by job.worker_restore_timeout: a restore may hold a worker's loop."""
    group, clock = workers.group, workers.clock
    restore = asyncio.ensure_future(group.restore(setup(tmp_path)))
    workers.reply(0, {"type": "surveys", "surveys": []})
    await turns()
    clock.advance(TIMEOUT - 1)  # worker 0 unheard for 29 s, in the restore
    workers.reply(1, {"type": "surveys", "surveys": []})
    await asyncio.wait_for(restore, 10)
    run = asyncio.ensure_future(group.run())
    await turns()
    clock.advance(HEARTBEAT_TIMEOUT - 0.1)
    await turns()
    assert not group.failure.done(), "the restore's silence counted against the run"
    clock.advance(0.2)
    await asyncio.wait_for(asyncio.shield(group.failure), 10)
    said = "worker 0 (pid None) unheard for 34.1s, worker 1 (pid None) unheard for 5.1s: "
    assert said in str(group.failure.result())
    with pytest.raises(WorkerError):
        await asyncio.wait_for(run, 10)


def test_the_restore_timeout_defaults_to_the_start_timeout() -> None:
    job = load_config(sets=["job.worker_start_timeout=45s"]).job
    assert (job.worker_start_timeout, job.worker_restore_timeout) == (45, None)
    job = load_config(sets=["job.worker_restore_timeout=30s"]).job
    assert (job.worker_start_timeout, job.worker_restore_timeout) == (120, 30)
    with pytest.raises(ConfigError, match=r"job\.worker_restore_timeout"):
        load_config(sets=["job.worker_restore_timeout=0s"])


async def test_the_failure_a_worker_reported_wins_over_a_send_after_its_goodbye(
    workers: Workers,
) -> None:
    """A failed worker reports why, then says goodbye; the main process sends on meanwhile.

    Old code: the send after the goodbye arrived, before the pump read the
    report queued ahead of it, failed the attempt as "connection worker-0 is
    closed": the user's error never reached the log (a loaded machine, the
    restore test of test_worker_hangs).
    """
    group, control = workers.group, workers.group.workers[0].control
    workers.reply(0, error_message(RuntimeError("injected failure at seq 5000")))
    await workers.ends[0].close()  # the goodbye
    while True:  # until the goodbye is read; the pump has not run since
        try:
            control.check_usable()
        except ChannelError:
            break
        await asyncio.sleep(0)
    group.request_roll()  # a send to it: refused
    await asyncio.sleep(0)
    assert not group.failure.done() or "injected failure" in str(group.failure.result())
    workers.clock.advance(10.0)  # past the grace: one failure or the other is due
    await asyncio.wait_for(asyncio.shield(group.failure), 10)
    assert "injected failure at seq 5000" in str(group.failure.result())


async def test_a_peer_channel_closed_waits_for_the_failure_that_closed_it(
    workers: Workers,
) -> None:
    """Worker 0 fails; worker 1's channel to it closes, and worker 1 may report that first.

    Old code: the first report read failed the attempt, so the log said
    "ChannelError: connection worker-0-1 is closed" and not the user's error.
    """
    group = workers.group
    workers.reply(1, error_message(ChannelError("connection worker-0-1 is closed")))
    await turns()
    workers.clock.advance(0.5)
    await turns()
    assert not group.failure.done()
    workers.reply(0, error_message(RuntimeError("injected failure at seq 5000")))
    await asyncio.wait_for(asyncio.shield(group.failure), 10)
    assert "injected failure at seq 5000" in str(group.failure.result())


async def test_a_peer_channel_closed_alone_still_fails_the_attempt(workers: Workers) -> None:
    workers.reply(1, error_message(ChannelError("connection worker-0-1 is closed")))
    await turns()
    workers.clock.advance(1.1)
    await asyncio.wait_for(asyncio.shield(workers.group.failure), 10)
    assert "worker-0-1 is closed" in str(workers.group.failure.result())
