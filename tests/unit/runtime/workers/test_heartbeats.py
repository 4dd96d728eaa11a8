"""Heartbeats: a worker's beat on its control connection, the main process's book of them.

The group's use of them (a running worker unheard for the timeout is killed)
is in ``test_worker_group_timeouts.py``; the real thing, a SIGSTOPped worker,
in ``tests/integration/runtime/workers/test_worker_hangs.py``.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.daemon.config import load_config
from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.runtime.network.remote import ChannelConnection
from aiostream_ckpt.runtime.wire import batch_codec
from aiostream_ckpt.runtime.workers.heartbeats import HeartbeatMonitor, HeartbeatSender


async def pending(conn: ChannelConnection) -> int:
    """Count the messages ``conn`` has received and not yet handed out."""
    for _ in range(30):
        await asyncio.sleep(0)
    n = conn.messages.qsize()
    for _ in range(n):
        assert conn.messages.get_nowait()["type"] == "heartbeat"
    return n


async def test_a_worker_beats_every_interval_and_says_how_late() -> None:
    clock = ManualClock()
    ours, theirs = socket.socketpair()
    worker, main = ChannelConnection("w", batch_codec()), ChannelConnection("m", batch_codec())
    await worker.start(ours)
    await main.start(theirs)
    try:
        async with HeartbeatSender(worker, 1.0, clock):
            assert await pending(main) == 1  # at once: the first after the hello
            clock.advance(0.9)
            assert await pending(main) == 0
            clock.advance(0.1)
            assert await pending(main) == 1
            clock.advance(3.5)  # the loop was held: one beat, 2.5 s late
            for _ in range(30):
                await asyncio.sleep(0)
            late = await main.receive_message()
            assert late == {"type": "heartbeat", "lag": 2.5}
        clock.advance(10.0)  # stopped: no more
        assert await pending(main) == 0
        assert clock.sleepers == 0
    finally:
        await worker.close()
        await main.close()


async def test_the_monitor_counts_silence_from_its_watch_and_reports_ages() -> None:
    clock = ManualClock(start=100.0)
    monitor = HeartbeatMonitor(2, 5.0, clock)
    assert monitor.age(0) is None
    monitor.heard(0, {"type": "surveys"})  # any message counts
    clock.advance(10.0)
    watch = asyncio.ensure_future(monitor.silent())
    await asyncio.sleep(0)
    monitor.heard(1, {"type": "heartbeat", "lag": 0.5})
    clock.advance(4.0)
    monitor.heard(1, {"type": "heartbeat", "lag": 0.1})
    await asyncio.sleep(0)
    assert not watch.done()
    clock.advance(1.0)  # worker 0 unheard for 15 s, 5 of them watched
    assert await asyncio.wait_for(watch, 5) == [(0, 15.0)]
    assert monitor.age(1) == 1.0 and monitor.max_lag(1) == 0.5 and monitor.max_lag(0) == 0.0


def test_the_timeout_must_be_longer_than_the_interval() -> None:
    job = load_config(sets=["job.heartbeat_interval=500ms", "job.heartbeat_timeout=3s"]).job
    assert (job.heartbeat_interval, job.heartbeat_timeout) == (0.5, 3.0)
    assert (load_config().job.heartbeat_interval, load_config().job.heartbeat_timeout) == (1, 20)
    said = (
        r"job\.heartbeat_timeout=2\.0: must be longer than job\.heartbeat_interval \(2s\): "
        "else a healthy worker is timed out between two of its heartbeats"
    )
    with pytest.raises(ConfigError, match=said):
        load_config(sets=["job.heartbeat_interval=2s", "job.heartbeat_timeout=2s"])
    with pytest.raises(ConfigError, match=r"job\.heartbeat_interval=0\.0: must be > 0"):
        load_config(sets=["job.heartbeat_interval=0s"])
