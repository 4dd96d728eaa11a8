"""Heartbeats from the worker processes to the main process (``job.workers`` > 1).

A worker that dies is seen at once: the end of its control connection, its
exit. One that hangs alive -- stopped (SIGSTOP), its event loop stuck in a
user function, a deadlock -- keeps its connection open. Before heartbeats
only an expiring checkpoint saw it (``checkpoint.timeout`` times
``checkpoint.tolerable_failures`` + 1: minutes), and nothing did with
checkpointing off. As Flink's TaskManagers heartbeat to the JobManager
(``heartbeat.interval`` 10 s, ``heartbeat.timeout`` 50 s), each worker sends
a heartbeat on its control connection every ``job.heartbeat_interval``
(:class:`HeartbeatSender`), and the main process fails the attempt once a
running worker has been silent for ``job.heartbeat_timeout``
(:class:`HeartbeatMonitor`): the worker is killed and named, and the restart
strategy applies as for its death. Any message counts as a heartbeat.

The sender is a task on the worker's event loop, not a thread: a thread
would go on beating while the loop is stuck, the very hang to see. A loop
busy with records still lets it run, because every task yields between
batches (a source after each batch, an input task whenever its bounded
queue is empty or its downstream full): a heartbeat is late by at most what
one task does between two yields. Each heartbeat says how late it was
(``lag``); the main process keeps the worst per worker (``/job``).

The defaults are for one node: Flink's 10 s / 50 s allow for a network
between machines, here the connection is a local socket and a missed
heartbeat means the worker's loop did not run. An interval of 1 s is one
small frame a second per worker; a timeout of 20 s sees a hang well before
any checkpoint timeout while leaving a healthy loop room for a long stall
(a garbage collection of a large heap, a slow user call) on a loaded machine.
The main process watches only once the workers run their tasks: restoring
state and recovering outputs are bounded by ``job.worker_restore_timeout``
instead (a restore may hold a worker's loop for long: a user ``open()``).
Both sides use the injected clock; tests move it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiostream_ckpt.clock import Clock
from aiostream_ckpt.errors import ChannelError
from aiostream_ckpt.runtime.network.remote import ChannelConnection
from aiostream_ckpt.runtime.workers.worker_messages import Message

#: loop turns that take a message from a socket to :meth:`HeartbeatMonitor.heard`
#: (readable -> the connection's queue -> the group's pump), with room to spare
_READ_TURNS = 10


class HeartbeatSender:
    """A worker's side: a heartbeat on its control connection every ``interval``, from its loop."""

    def __init__(self, control: ChannelConnection, interval: float, clock: Clock) -> None:
        self._control = control
        self._interval = interval
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="heartbeats")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def __aenter__(self) -> HeartbeatSender:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _run(self) -> None:
        due = self._clock.monotonic()
        while True:
            now = self._clock.monotonic()
            try:
                self._control.send_message({"type": "heartbeat", "lag": max(0.0, now - due)})
            except ChannelError:  # the main process is gone: the attempt's own code sees it
                return
            due = now + self._interval
            await self._clock.sleep(self._interval)


@dataclass
class _Heard:
    last: float | None = None
    max_lag: float = 0.0


class HeartbeatMonitor:
    """The main process's side: when each worker was last heard, and who is silent too long."""

    def __init__(self, workers: int, timeout: float, clock: Clock) -> None:
        self.timeout = timeout
        self._clock = clock
        self._heard = [_Heard() for _ in range(workers)]

    def heard(self, worker: int, message: Message) -> None:
        """Note any message of ``worker`` (a heartbeat says how late it came, too)."""
        h = self._heard[worker]
        h.last = self._clock.monotonic()
        if message["type"] == "heartbeat":
            h.max_lag = max(h.max_lag, float(message.get("lag", 0.0)))

    def age(self, worker: int) -> float | None:
        """Seconds since ``worker`` was last heard (None: never)."""
        last = self._heard[worker].last
        return None if last is None else self._clock.monotonic() - last

    def max_lag(self, worker: int) -> float:
        """Return the most a heartbeat of ``worker`` came late: its loop's longest hold."""
        return self._heard[worker].max_lag

    async def silent(self) -> list[tuple[int, float]]:
        """Return once workers have been silent for the timeout: (worker, seconds unheard).

        Silence counts from the call at the earliest: a worker's earlier steps
        have their own bound. The seconds returned are since it was last heard.
        Messages that arrived by the deadline are read first, and count.
        """
        armed = self._clock.monotonic()
        read = False
        while True:
            now = self._clock.monotonic()
            last = [armed if h.last is None else h.last for h in self._heard]
            since = [max(t, armed) for t in last]
            over = [i for i, t in enumerate(since) if now - t >= self.timeout]
            if over and read:
                return [(i, now - last[i]) for i in over]
            if over:
                # Read what has arrived before blaming anyone: were this process's own
                # loop held up (a long collection), heartbeats would wait unread in its
                # sockets while this wake-up, due first, ran ahead of them.
                for _ in range(_READ_TURNS):
                    await asyncio.sleep(0)
                read = True
                continue
            read = False
            await self._clock.sleep(min(since) + self.timeout - now)
