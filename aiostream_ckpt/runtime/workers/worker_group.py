"""The main process's side of an attempt run by worker processes (``job.workers`` > 1).

The main process keeps the :class:`~aiostream_ckpt.checkpoint.coordinator.CheckpointCoordinator`
and runs no task: every subtask runs in worker ``subtask % workers``
(``runtime.network.placement``), each worker a process with its own event loop. To the
coordinator the group stands in for the remote tasks: it registers every
task id (so a checkpoint completes only with every subtask's ack), a
:class:`~aiostream_ckpt.checkpoint.participants.TriggerTarget` per source
task that sends the trigger to its worker, and one listener that passes
completions and aborts to every worker. The workers' acks, declines and
ends of input come back to the coordinator as if from local tasks.

Retention runs here too, but the pins of shared files (``CheckpointStorage.pin``)
live in the workers' state backends: each retention pass asks every worker for
its pins after listing the files (:meth:`WorkerGroup.remote_pins`).

The attempt runs in the steps of ``runtime.workers.worker_attempt``. Any worker's
failure -- an error it reports, or its death, seen as the end of its control
connection -- fails the attempt; :meth:`WorkerGroup.stop` then ends every
worker, and the runner restarts them all from the latest completed checkpoint.
A worker alive but silent fails it too: one that does not say hello within
``job.worker_start_timeout``, or does not finish its restore or its outputs'
recovery within ``job.worker_restore_timeout``, is killed (no death would end
those waits); once the tasks run, one unheard for ``job.heartbeat_timeout`` is
(``runtime.workers.heartbeats``). Each step has its own deadline, from its start: how
long a hello takes (starting Python on a loaded machine) never eats into the
restore's bound, and a short restore bound does not cut a slow hello short.

The workers' reports of their subtasks' figures are kept in
:attr:`WorkerGroup.reports` (``runtime.workers.worker_metrics``), marked failed when
a worker dies and stopped with the attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiostream_ckpt.aio import BackgroundTasks
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier, CheckpointKind
from aiostream_ckpt.checkpoint.coordinator import CheckpointCoordinator
from aiostream_ckpt.checkpoint.storage import CheckpointStorage
from aiostream_ckpt.clock import Clock, SystemClock, wait_within
from aiostream_ckpt.connectors.base import OutputSurvey
from aiostream_ckpt.errors import ChannelError, CheckpointError, WorkerError
from aiostream_ckpt.jobspec.graph import Transformation, TransformKind
from aiostream_ckpt.runtime.graph import Chain
from aiostream_ckpt.runtime.network.placement import (
    graph_fingerprint,
    task_id,
    worker_of,
    worker_tasks,
)
from aiostream_ckpt.runtime.workers.attempt import AttemptSetup
from aiostream_ckpt.runtime.workers.heartbeats import HeartbeatMonitor
from aiostream_ckpt.runtime.workers.worker_messages import (
    Message,
    ack_of,
    barrier_message,
    error_of,
    restore_json,
    surveys_of,
)
from aiostream_ckpt.runtime.workers.worker_metrics import WorkerReports
from aiostream_ckpt.runtime.workers.worker_process import (
    WorkerLaunch,
    WorkerProcess,
    WorkerState,
    exit_description,
    spawn_all,
)

log = logging.getLogger(__name__)

#: how long a worker asked to stop may take before it is killed (on the injected clock)
STOP_GRACE_SECONDS = 30.0
#: after a worker's exit, how long its last words (a failure it reported, the end of its
#: connection) may take to be read before the exit itself fails the attempt (injected clock);
#: also how long a consequence (a closed connection: a message refused, a worker's report
#: that its channel to a peer closed) waits for the cause (the peer's reported failure)
EXIT_GRACE_SECONDS = 1.0


class _RemoteSource:
    """A source task in a worker, as the coordinator triggers it."""

    def __init__(self, group: WorkerGroup, worker: int, task: str) -> None:
        self._group, self._worker, self._task = group, worker, task

    def trigger_checkpoint(self, barrier: CheckpointBarrier) -> None:
        self._group.trigger(self._worker, self._task, barrier)


@dataclass(frozen=True)
class _Step:
    """A step every worker takes before the tasks run, bounded by its own timeout."""

    what: str  # as the failure says it: "did not <what> within ..."
    timeout: float
    key: str  # job.worker_<key>_timeout


class _Unheard:
    """The listener of every remote task but one: the group tells each worker once."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        pass

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        pass


class WorkerGroup:
    """Starts the workers of one attempt and speaks for their tasks to the coordinator."""

    def __init__(
        self,
        launch: WorkerLaunch,
        transformations: Sequence[Transformation],
        chains: list[Chain],
        coordinator: CheckpointCoordinator,
        storage: CheckpointStorage,
        *,
        attempt: int = 0,
        start_timeout: float = 120.0,
        restore_timeout: float | None = None,
        heartbeat_timeout: float = 20.0,
        clock: Clock | None = None,
        spawned: list[WorkerProcess] | None = None,
    ) -> None:
        """``spawned``: the workers, started early for ``launch`` (:class:`.EarlyWorkers`).

        ``restore_timeout``: None is ``start_timeout``.
        """
        self.launch = launch
        self.count = launch.workers
        self._fingerprint = graph_fingerprint(transformations)
        self._chains = chains
        self._coordinator = coordinator
        self._storage = storage
        self._clock = clock or SystemClock()
        #: how long a worker may take to say hello
        self.start_timeout = start_timeout
        #: how long a worker may take to restore, and to recover its outputs (each)
        self.restore_timeout = start_timeout if restore_timeout is None else restore_timeout
        # fail points kill a worker once per run of the command, as they kill the main
        # process once: the workers of a restarted attempt are not armed again
        self.workers = spawned or [
            WorkerProcess(i, launch, arm_failpoints=attempt == 0) for i in range(self.count)
        ]
        loop = asyncio.get_running_loop()
        #: resolves to the first failure of any worker (reported, or its death)
        self.failure: asyncio.Future[BaseException] = loop.create_future()
        self._bg = BackgroundTasks(self._fail)
        #: replies by (worker, type): surveys, recovered, done, pins
        self._replies: dict[tuple[int, str], asyncio.Queue[Message]] = {}
        self._loop = loop
        self._pins_lock = asyncio.Lock()
        #: each worker's latest figures of its subtasks (REST, metrics, progress)
        #: when each worker was last heard (any message; its heartbeats at the least)
        self.heartbeats = HeartbeatMonitor(self.count, heartbeat_timeout, self._clock)
        self.reports = WorkerReports(self.count, self._clock.monotonic, self.heartbeats)
        self._stopping = False
        #: workers a message could not be sent to (their failure is on its way)
        self._unsendable: set[int] = set()
        #: the newest checkpoint each worker confirmed its tasks committed, by worker
        self._committed: dict[int, int] = {}

    def _fail(self, exc: BaseException) -> None:
        if not self.failure.done():
            self.failure.set_result(exc)

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Start every worker (unless started early), then wait for their hellos."""
        if any(w.pid is None for w in self.workers):
            await spawn_all(self.workers)
        heads = [(c.head.uid, c.parallelism) for c in self._chains]
        starts = [
            asyncio.ensure_future(
                w.start(self._fingerprint, worker_tasks(heads, w.index, self.count))
            )
            for w in self.workers
        ]
        try:
            await self._each(starts, _Step("say hello", self.start_timeout, "start"))
        except BaseException:  # the first failure ends the others' starts (each kills its own)
            for t in starts:
                t.cancel()
            await asyncio.gather(*starts, return_exceptions=True)
            raise
        for w in self.workers:
            log.info("worker %d started (pid %s): %s", w.index, w.pid, ", ".join(w.hello["tasks"]))
            self.reports.started(w.index, w.pid)
            pump = self._bg.spawn(self._pump(w), f"worker-{w.index}-control")
            self._bg.spawn(self._watch_exit(w, pump), f"worker-{w.index}-exit")
        self._register()

    async def stop(self) -> None:
        """Ask every worker to stop (kill one that does not in time), then stop listening."""
        self._stopping = True  # the ends of their connections are no deaths now

        async def one(w: WorkerProcess) -> None:
            try:
                await wait_within(w.stop(), STOP_GRACE_SECONDS, self._clock)
            except TimeoutError:
                log.warning("worker %d did not stop in time: killing it", w.index)
                await w.kill()
            except ChannelError as exc:  # it failed or died: make sure it is gone
                log.debug("worker %d: %s; killing it", w.index, exc)
                await w.kill()

        await asyncio.gather(*(one(w) for w in self.workers))
        await self._bg.cancel_all()
        for w in self.workers:
            lag = self.heartbeats.max_lag(w.index)
            log.debug("worker %d: its heartbeats came at most %.3fs late", w.index, lag)
        for w in self.workers:  # died, failed or killed: its subtasks failed with it
            self.reports.stopped(w.index, failed=w.state is WorkerState.FAILED)

    async def __aenter__(self) -> WorkerGroup:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- the coordinator's view -------------------------------------------------------

    def _register(self) -> None:
        coordinator = self._coordinator
        listener: Any = self
        for chain in self._chains:
            is_source = chain.head.kind is TransformKind.SOURCE
            for sub in range(chain.parallelism):
                tid = task_id(chain.head.uid, sub)
                coordinator.register_task(tid, listener)
                listener = _Unheard()
                if is_source:
                    worker = worker_of(sub, self.count)
                    coordinator.register_source(tid, _RemoteSource(self, worker, tid))

    def trigger(self, worker: int, task: str, barrier: CheckpointBarrier) -> None:
        if barrier.kind is CheckpointKind.SAVEPOINT:  # every worker writes into its directory
            sp = self._coordinator.savepoint_dir(barrier.checkpoint_id)
            self._send_all(
                {"type": "checkpoint", "id": barrier.checkpoint_id, "savepoint_dir": str(sp)}
            )
        self._send(worker, barrier_message(task, barrier))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        # after the coordinator has settled n: the final id is known by then
        self._loop.call_soon(self._notify, True, checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._loop.call_soon(self._notify, False, checkpoint_id)

    def _notify(self, complete: bool, checkpoint_id: int) -> None:
        finished = self._coordinator.finished
        final = finished.result() if finished.done() else None
        self._send_all(
            {"type": "notify", "complete": complete, "id": checkpoint_id, "final": final}
        )

    def committed(self) -> int | None:
        """Return the newest checkpoint every worker confirmed committed (None: not all yet)."""
        if len(self._committed) < self.count:
            return None
        return min(self._committed.values())

    def request_roll(self) -> None:
        """Have the rolling file sinks in every worker close their part files at the next one."""
        self._send_all({"type": "roll"})

    def remote_pins(self) -> set[str]:
        """Every worker's pinned shared files (called by retention, in an executor thread).

        A worker alive but not answering within the checkpoint timeout is hung
        (its loop blocked): that fails the attempt, whose stop kills it. Unbounded,
        the coordinator's stop waited for this thread and the job hung instead.
        """
        return asyncio.run_coroutine_threadsafe(self._ask_pins(), self._loop).result()

    async def _ask_pins(self) -> set[str]:
        timeout = self._coordinator.config.timeout
        async with self._pins_lock:
            self._send_all({"type": "pins?"})
            try:
                replies = await wait_within(self._all("pins"), timeout, self._clock)
            except TimeoutError:
                why = f"a worker did not say its pinned files within {timeout:g}s: hung"
                self._fail(ChannelError(why))  # no pass after this one reads a late reply
                raise CheckpointError(f"retention skipped: {why}") from None
        return {f for r in replies for f in r["files"]}

    # -- the attempt's steps ------------------------------------------------------------

    async def restore(self, setup: AttemptSetup) -> list[OutputSurvey]:
        """Have every worker build its share and restore its state; return all the surveys."""
        restored = setup.restored
        self._send_all(
            {
                "type": "attempt",
                "attempt": setup.attempt,
                "restored": str(restored.directory) if restored is not None else None,
                "restore": restore_json(setup.restore),
                "fallback": setup.fallback,
                "local_dir": str(setup.local_dir),
            }
        )
        replies = await self._all("surveys", self._restore_step("restore its state"))
        return [s for r in replies for s in surveys_of(r)]

    async def recover(self) -> None:
        """Have every worker recover its outputs (the restore was accepted)."""
        self._send_all({"type": "recover"})
        await self._all("recovered", self._restore_step("recover its outputs"))

    async def run(self) -> None:
        """Start the tasks; return once every worker's tasks ended, raise the first failure.

        From here on a worker unheard for the heartbeat timeout fails the attempt.
        """
        self._bg.spawn(self._watch_heartbeats(), "heartbeats")
        self._send_all({"type": "run"})
        await self._all("done")

    # -- messages -----------------------------------------------------------------------

    def _send(self, worker: int, message: Message) -> None:
        try:
            self.workers[worker].control.send_message(message)
        except ChannelError as exc:  # dead, or said goodbye: its failure ends the attempt
            if worker not in self._unsendable:
                self._unsendable.add(worker)
                self._bg.spawn(self._fail_later(exc), f"worker-{worker}-unsendable")

    async def _fail_later(self, exc: ChannelError) -> None:
        """Fail with ``exc`` unless the worker's pump reads why first (within the exit grace).

        A worker that failed reports why, then says goodbye: a message sent to
        it after the goodbye arrived, before its pump read the report queued
        ahead of it, failed the attempt as "connection closed" and the cause
        (the user's error) was lost from the log.
        """
        await self._clock.sleep(EXIT_GRACE_SECONDS)
        raise exc

    def _send_all(self, message: Message) -> None:
        for w in self.workers:
            self._send(w.index, message)

    def _queue(self, worker: int, kind: str) -> asyncio.Queue[Message]:
        return self._replies.setdefault((worker, kind), asyncio.Queue())

    def _restore_step(self, what: str) -> _Step:
        return _Step(what, self.restore_timeout, "restore")

    async def _all(self, kind: str, step: _Step | None = None) -> list[Message]:
        """Wait for a ``kind`` reply from every worker; raise the first failure instead.

        ``step``: the step the workers take, bounded by its own timeout (:meth:`_each`).
        """
        gets = [asyncio.ensure_future(self._queue(w.index, kind).get()) for w in self.workers]
        try:
            return await self._each(gets, step)
        finally:
            for g in gets:
                g.cancel()

    async def _each(self, steps: Sequence[asyncio.Future[Any]], step: _Step | None) -> list[Any]:
        """Wait for each worker's step (one per worker, in order); raise the first failure.

        With ``step`` the wait is bounded by its timeout, counted from now (the
        step's request), not from the workers' start: the workers whose step
        has not ended by then are alive but silent (a death would have failed
        the group), so they are killed and named. Without, only a failure ends
        the wait early.
        """
        pending: set[asyncio.Future[Any]] = {*steps, self.failure}
        deadline = None
        if step is not None:
            deadline = asyncio.ensure_future(self._clock.sleep(step.timeout))
            pending.add(deadline)
        try:
            while not all(t.done() for t in steps):
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if self.failure in done:
                    raise self.failure.result()
                for t in done:
                    if t in steps:
                        t.result()  # a step's own failure (a worker refused, say)
                if step is not None and deadline in done:
                    silent = [w for w, t in zip(self.workers, steps, strict=True) if not t.done()]
                    named = ", ".join(f"worker {w.index} (pid {w.pid})" for w in silent)
                    raise await self._kill_hung(
                        silent,
                        f"{named} did not {step.what} within {step.timeout:g}s "
                        f"(job.worker_{step.key}_timeout): hung, killed",
                    )
            return [t.result() for t in steps]
        finally:
            if deadline is not None:
                deadline.cancel()

    async def _kill_hung(self, workers: list[WorkerProcess], why: str) -> WorkerError:
        """Kill ``workers`` (alive, silent: a stop would wait for them); fail with ``why``."""
        error = WorkerError(why, retriable=True)
        self._fail(error)  # before the kills: their ends of connection are not the cause
        await asyncio.gather(*(w.kill() for w in workers))
        return error

    async def _watch_heartbeats(self) -> None:
        """Fail the attempt once a running worker is unheard for the heartbeat timeout."""
        silent = await self.heartbeats.silent()
        if self._stopping:  # a stop's own grace ends a worker that does not stop
            return
        named = ", ".join(
            f"worker {i} (pid {self.workers[i].pid}) unheard for {seconds:.1f}s"
            for i, seconds in silent
        )
        raise await self._kill_hung(
            [self.workers[i] for i, _ in silent],
            f"{named}: no heartbeat within {self.heartbeats.timeout:g}s "
            "(job.heartbeat_timeout): hung, killed",
        )

    async def _watch_exit(self, w: WorkerProcess, pump: asyncio.Task[None]) -> None:
        """Fail the attempt when ``w`` exits unasked, even if its connection stays open.

        The end of its control connection usually says it first (the pump's
        error, or the failure it reported, wins). But a process the worker
        forked keeps the socket open after the worker died: no end of file
        comes, and only the exit tells.
        """
        code = await w.exited()
        with contextlib.suppress(TimeoutError):  # the pump's own end (or error) is not ours
            await wait_within(asyncio.wait([pump]), EXIT_GRACE_SECONDS, self._clock)
        if self._stopping:
            return
        self.reports.failed(w.index)
        raise WorkerError(
            f"worker {w.index} (pid {w.pid}) {exit_description(code)}", retriable=True
        )

    async def _pump(self, w: WorkerProcess) -> None:
        """Hand one worker's messages on; its end (death, reported failure) marks its figures."""
        try:
            await self._handle_messages(w)
        except Exception:
            if not self._stopping:  # else stop() marks them stopped
                self.reports.failed(w.index)
            raise

    async def _handle_messages(self, w: WorkerProcess) -> None:
        """Hand one worker's messages to the coordinator or to whoever waits for a reply."""
        coordinator = self._coordinator
        while True:
            message = await w.control.receive_message()
            self.heartbeats.heard(w.index, message)
            kind = message["type"]
            if kind == "heartbeat":
                continue
            if kind == "metrics":
                self.reports.update(message)
            elif kind == "ack":
                coordinator.acknowledge(message["id"], ack_of(message))
            elif kind == "decline":
                reason = CheckpointError(message["reason"])
                coordinator.decline(message["id"], message["task"], reason)
            elif kind == "source_finished":
                coordinator.source_finished(message["task"])
            elif kind == "committed":
                cid = max(message["id"], self._committed.get(w.index, 0))
                self._committed[w.index] = cid
            elif kind == "failed":
                error = error_of(message, w.index)
                if isinstance(error, ChannelError):  # a peer's end: its own cause may follow
                    await self._clock.sleep(EXIT_GRACE_SECONDS)
                raise error
            elif kind in ("surveys", "recovered", "done", "pins"):
                self._queue(w.index, kind).put_nowait(message)
            else:
                raise WorkerError(f"worker {w.index} sent an unknown message {kind!r}")
