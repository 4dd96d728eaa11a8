"""Retention asks the workers for their pins: a worker that never answers must not hang main.

Retention runs in the coordinator's executor after a checkpoint completes
and holds its finalize lock; on a failover the coordinator waits for it
before the workers are stopped. A worker alive but hung (a user function
blocking its loop) never answers ``pins?``: without a bound the retention
thread waited forever, the coordinator's stop waited for the thread, and
the main process never got to killing the worker -- the job hung instead of
restarting. Now the question has the checkpoint timeout: past it the
attempt fails (the stop kills the worker) and this pass deletes nothing.
"""

from __future__ import annotations

import asyncio
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aiostream_ckpt.checkpoint.config import CheckpointConfig
from aiostream_ckpt.checkpoint.storage import CheckpointStorage
from aiostream_ckpt.clock import SystemClock
from aiostream_ckpt.errors import ChannelError, CheckpointError
from aiostream_ckpt.runtime.network.remote import ChannelConnection
from aiostream_ckpt.runtime.wire import batch_codec
from aiostream_ckpt.runtime.workers.worker_group import WorkerGroup
from aiostream_ckpt.runtime.workers.worker_process import WorkerLaunch
from tests.helpers import job_coordinator


async def test_a_worker_that_never_says_its_pins_fails_the_attempt(tmp_path: Path) -> None:
    storage = CheckpointStorage(tmp_path / "ckpt")
    executor = ThreadPoolExecutor(max_workers=1)
    coordinator = job_coordinator(storage, SystemClock(), executor, CheckpointConfig(timeout=0.2))
    launch = WorkerLaunch("apps.pv_count", None, (), 2)
    group = WorkerGroup(launch, [], [], coordinator, storage)
    hung: list[ChannelConnection] = []  # the workers' ends: alive, never reading
    for w in group.workers:
        ours, theirs = socket.socketpair()
        await w.control.start(ours)
        hung.append(ChannelConnection(f"hung-{w.index}", batch_codec()))
        await hung[-1].start(theirs)
    try:
        ask = asyncio.get_running_loop().run_in_executor(executor, group.remote_pins)
        with pytest.raises(CheckpointError, match="pinned files"):
            await asyncio.wait_for(ask, 10)
        assert group.failure.done()
        assert isinstance(group.failure.result(), ChannelError)
    finally:
        if not group.failure.done():  # the old code's thread waits for an answer or this
            group.failure.set_result(ChannelError("the test is over"))
        for conn in [*hung, *(w.control for w in group.workers)]:
            await conn.close()
        executor.shutdown(wait=True)
