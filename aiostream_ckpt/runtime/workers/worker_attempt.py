"""A worker's side of an attempt: its share of the tasks, the coordinator behind a socket.

The worker builds its subtasks with the same code as a single process
(``runtime.workers.attempt``) and gives them a :class:`WorkerCoordinator`: to a task it
is the coordinator (``TaskCoordinator``), but acks, declines and ends of
input go to the main process's CheckpointCoordinator over the control
connection, and triggers and notifications come back the same way. The
attempt then follows the main process step by step (``runtime.workers.worker_messages``):

1. ``attempt``: build the share from the chosen restore point, start the peer
   connections, restore state and survey the outputs -> ``surveys``;
2. ``recover``: recover the outputs (only once the main process accepted every
   worker's surveys) -> ``recovered``;
3. ``run``: run the tasks until every one ended (-> ``done``) or one failed
   (-> ``failed``, and the worker exits); ``stop`` ends it either way.
   Meanwhile, once every task here acted on a checkpoint's completion (its
   sinks committed), the worker confirms it (-> ``committed``): a stop in the
   main process waits for that before it ends the workers.

A worker never retries: a failure ends the process and the main process
restarts every worker from the latest completed checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiostream_ckpt.aio import BackgroundTasks
from aiostream_ckpt.checkpoint.metadata import TaskAck
from aiostream_ckpt.checkpoint.participants import CheckpointListener, TriggerTarget
from aiostream_ckpt.checkpoint.storage import CheckpointStorage, read_checkpoint, savepoint_target
from aiostream_ckpt.clock import SystemClock
from aiostream_ckpt.errors import ChannelError, CheckpointError, WorkerError
from aiostream_ckpt.jobspec.graph import JobSpec
from aiostream_ckpt.runtime.failover.recovery import recover_outputs, verify_and_survey
from aiostream_ckpt.runtime.graph import Chain
from aiostream_ckpt.runtime.network.placement import ProcessShare
from aiostream_ckpt.runtime.network.remote import ChannelConnection
from aiostream_ckpt.runtime.task import StreamTask
from aiostream_ckpt.runtime.wire import batch_codec
from aiostream_ckpt.runtime.workers.attempt import AttemptSetup, AttemptThreads, build_tasks
from aiostream_ckpt.runtime.workers.worker_messages import (
    Message,
    ack_message,
    barrier_of,
    error_message,
    path_or_none,
    restore_of,
    surveys_message,
)
from aiostream_ckpt.runtime.workers.worker_metrics import MetricsReporter
from aiostream_ckpt.state.backend import SnapshotTarget

log = logging.getLogger(__name__)


class _Stopped(Exception):
    """The main process said stop before the attempt ran (another worker failed)."""


class WorkerCoordinator:
    """The coordinator as a worker's tasks see it; the real one is in the main process."""

    def __init__(self, control: ChannelConnection, storage: CheckpointStorage, index: int) -> None:
        self._control = control
        self._index = index
        self._storage = storage
        self._listeners: list[CheckpointListener] = []
        self._sources: dict[str, TriggerTarget] = {}
        self._savepoint_dirs: dict[int, Path] = {}
        #: checkpoints the main process said were aborted (and not yet passed by a
        #: completed one): a task reaching one's barrier late writes nothing for it
        self._aborted: set[int] = set()
        #: called after each ack: the figures go out with the checkpoint's progress
        self.on_ack: Callable[[], None] | None = None
        #: has the rolling file sinks here close their part files at the next checkpoint
        self.on_roll: Callable[[], None] | None = None
        #: resolves to the final checkpoint's id, told with the notifications
        self.finished: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        # where a savepoint goes, and a roll before a stop's checkpoint, are acted on at
        # arrival, not when the pump gets to them: the barrier from another worker's
        # source may reach a task here in the same loop turn
        control.on_message = self._on_arrival

    # -- TaskCoordinator ------------------------------------------------------------

    def register_task(self, task_id: str, listener: CheckpointListener) -> None:
        self._listeners.append(listener)

    def register_source(self, task_id: str, source: TriggerTarget) -> None:
        self._sources[task_id] = source

    def source_finished(self, task_id: str) -> None:
        self._control.send_message({"type": "source_finished", "task": task_id})

    def snapshot_target(self, checkpoint_id: int, uid: str, subtask: int) -> SnapshotTarget:
        if checkpoint_id in self._aborted:  # as the main process's coordinator refuses it
            raise CheckpointError(f"checkpoint {checkpoint_id} has ended: nothing to write")
        sp = self._savepoint_dirs.get(checkpoint_id)
        if sp is None:  # the same directory the main process's coordinator would give
            return self._storage.target(checkpoint_id, uid, subtask)
        return savepoint_target(sp, checkpoint_id, uid, subtask)

    def acknowledge(self, checkpoint_id: int, ack: TaskAck) -> None:
        ack = dataclasses.replace(ack, worker=self._index, pid=os.getpid())
        self._control.send_message(ack_message(checkpoint_id, ack))
        if self.on_ack is not None:
            self.on_ack()

    def decline(self, checkpoint_id: int, task_id: str, reason: BaseException) -> None:
        why = f"{type(reason).__name__}: {reason}"
        self._control.send_message(
            {"type": "decline", "id": checkpoint_id, "task": task_id, "reason": why}
        )

    # -- from the main process ------------------------------------------------------

    def _on_arrival(self, message: Message) -> None:
        kind = message["type"]
        if kind == "checkpoint":
            sp = path_or_none(message.get("savepoint_dir"))
            if sp is not None:
                self._savepoint_dirs[message["id"]] = sp
        elif kind == "roll" and self.on_roll is not None:
            self.on_roll()

    def handle(self, message: Message) -> None:
        """Act on a checkpoint message of the main process (trigger, notify, pins?)."""
        kind = message["type"]
        if kind == "checkpoint":
            pass  # noted on arrival (_on_arrival)
        elif kind == "trigger":
            self._sources[message["task"]].trigger_checkpoint(barrier_of(message))
        elif kind == "notify":
            cid, final = message["id"], message.get("final")
            # before the listeners: a task leaves once the final checkpoint is committed
            if final is not None and not self.finished.done():
                self.finished.set_result(final)
            self._savepoint_dirs.pop(cid, None)
            if message["complete"]:  # every task here passed the older barriers
                self._aborted = {a for a in self._aborted if a > cid}
            else:
                self._aborted.add(cid)
            for listener in self._listeners:
                if message["complete"]:
                    listener.notify_checkpoint_complete(cid)
                else:
                    listener.notify_checkpoint_aborted(cid)
        elif kind == "pins?":
            files = sorted(self._storage.local_pins())
            self._control.send_message({"type": "pins", "files": files})
        else:
            raise WorkerError(f"unexpected message from the main process: {kind!r}")


async def _expect(control: ChannelConnection, kind: str) -> Message:
    message = await control.receive_message()
    if message["type"] == "stop":
        raise _Stopped
    if message["type"] != kind:
        raise WorkerError(f"expected {kind!r} from the main process, got {message['type']!r}")
    return message


async def serve_attempt(
    control: ChannelConnection,
    spec: JobSpec,
    chains: list[Chain],
    share_of: tuple[int, int],
    peer_sockets: dict[int, socket.socket],
) -> int:
    """Run this worker's share of one attempt (see the module docstring); the exit code."""
    index, workers = share_of
    try:
        first = await _expect(control, "attempt")
    except _Stopped:
        return 0
    config = spec.config
    checkpoints = config.checkpoint_dir()
    assert checkpoints is not None  # the main process refuses a job without
    storage = CheckpointStorage(checkpoints)
    restored_dir = path_or_none(first["restored"])
    setup = AttemptSetup(
        job_name=spec.job_name,
        config=config,
        params=dict(spec.params),
        clock=SystemClock(),
        attempt=first["attempt"],
        restored=read_checkpoint(restored_dir) if restored_dir is not None else None,
        restore=restore_of(first["restore"]),
        fallback=first["fallback"],
        local_dir=Path(first["local_dir"]),
    )
    coordinator = WorkerCoordinator(control, storage, index)
    codec = batch_codec()
    peers = {j: ChannelConnection(f"worker-{index}-{j}", codec) for j in peer_sockets}
    threads = AttemptThreads()
    tasks: list[StreamTask] = []
    ran = False
    reporting: asyncio.Task[None] | None = None
    try:
        tasks = build_tasks(
            setup, chains, coordinator, threads, ProcessShare(index, workers, peers)
        )
        reporter = MetricsReporter(control, index, tasks, setup.clock.monotonic)
        coordinator.on_ack = reporter.report_soon
        coordinator.on_roll = functools.partial(_roll, tasks)
        reporting = asyncio.create_task(reporter.run(), name="metrics")
        for j, conn in peers.items():
            await conn.start(peer_sockets[j])
        control.send_message(surveys_message(await verify_and_survey(tasks)))
        await _expect(control, "recover")
        await recover_outputs(tasks)
        control.send_message({"type": "recovered"})
        await _expect(control, "run")
        ran = True
        return await _run(control, coordinator, tasks, peers, reporter)
    except _Stopped:
        return 0
    except ChannelError as exc:
        if control.failure.done():  # the main process is gone: nobody to tell
            log.error("worker %d: %s", index, exc)
            return 1
        _report(control, exc)
        return 1
    except Exception as exc:
        _report(control, exc)
        return 1
    finally:
        if reporting is not None:
            reporting.cancel()
            await asyncio.gather(reporting, return_exceptions=True)
        if not ran:
            await asyncio.gather(*(t.close() for t in tasks), return_exceptions=True)
        await asyncio.gather(*(c.close() for c in peers.values()), return_exceptions=True)
        threads.shutdown()


def _roll(tasks: list[StreamTask]) -> None:
    for t in tasks:
        t.request_roll()


def _report(control: ChannelConnection, exc: BaseException) -> None:
    with contextlib.suppress(ChannelError):  # else the main process is gone too
        control.send_message(error_message(exc))


async def _pump(
    control: ChannelConnection, coordinator: WorkerCoordinator, tasks: list[StreamTask]
) -> None:
    """Hand the main process's messages to the coordinator proxy until it says stop.

    Confirms each completion once every task acted on it (see the module docstring).
    """
    confirms = BackgroundTasks(lambda exc: None)  # a task's failure is reported by _run
    try:
        while True:
            message = await control.receive_message()
            kind = message["type"]
            if kind == "stop":
                return
            if kind == "roll":  # acted on at arrival (WorkerCoordinator._on_arrival)
                continue
            coordinator.handle(message)
            if kind == "notify" and message["complete"]:
                cid = message["id"]
                confirms.spawn(_confirm(control, tasks, cid), f"confirm-{cid}")
    finally:
        await confirms.cancel_all()


async def _confirm(control: ChannelConnection, tasks: list[StreamTask], cid: int) -> None:
    await asyncio.gather(*(t.committed(cid) for t in tasks))
    with contextlib.suppress(ChannelError):  # the main process is gone: nobody waits
        control.send_message({"type": "committed", "id": cid})


async def _run(
    control: ChannelConnection,
    coordinator: WorkerCoordinator,
    tasks: list[StreamTask],
    peers: dict[int, ChannelConnection],
    reporter: MetricsReporter,
) -> int:
    """Run the tasks; report the first failure or that all ended; return at stop."""
    running = [asyncio.create_task(t.run(), name=t.task_id) for t in tasks]
    pump = asyncio.create_task(_pump(control, coordinator, tasks), name="control")
    watch: set[asyncio.Future[Any]] = {*running, pump, *(c.failure for c in peers.values())}
    try:
        while True:
            done, _ = await asyncio.wait(watch, return_when=asyncio.FIRST_COMPLETED)
            if pump in done:
                pump.result()  # a dead control connection raises: the main process is gone
                return 0
            for fut in done:
                watch.discard(fut)
                # a task's failure, or a peer connection's (the other worker died)
                exc = fut.exception() if fut in running else fut.result()
                if exc is not None:
                    _report(control, exc)
                    return 1
            if running and not any(t in watch for t in running):
                running = []
                reporter.report()  # the final figures, before the main process hears "done"
                control.send_message({"type": "done"})
    finally:
        for t in [*running, pump]:
            t.cancel()
        await asyncio.gather(*running, pump, return_exceptions=True)
