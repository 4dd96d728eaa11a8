"""Running a job: attempts, failover, recovery from the latest checkpoint.

One *attempt* builds every task afresh, restores them from the newest valid
completed checkpoint (or the savepoint given at start), and runs them with a
:class:`CheckpointCoordinator`. When a task fails, all tasks are cancelled and
the restart strategy decides when (or whether) the next attempt starts. A
process killed with SIGKILL recovers the same way when started again on the
same checkpoint directory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from aiostream_ckpt.checkpoint.coordinator import CheckpointCoordinator
from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.checkpoint.object_storage import ObjectCheckpointStorage, open_storage
from aiostream_ckpt.clock import Clock, SystemClock
from aiostream_ckpt.errors import (
    AiostreamError,
    ConfigError,
    CorruptCheckpointError,
    JobFailedError,
    RestoreRefusedError,
    StateMigrationError,
    UserFunctionError,
)
from aiostream_ckpt.jobspec.graph import JobSpec
from aiostream_ckpt.runtime.failover.ownership import DirectoryLocks, job_directories
from aiostream_ckpt.runtime.failover.recovery import (
    RestorePoints,
    decide_restore,
    restore_info,
    restore_tasks,
)
from aiostream_ckpt.runtime.failover.restart import NoRestart, RestartStrategy, restart_strategy
from aiostream_ckpt.runtime.failover.shard_layout import check_shard_layout
from aiostream_ckpt.runtime.global_commit import GlobalCommitters, recover_checkpoint_id
from aiostream_ckpt.runtime.graph import Chain, plan_chains
from aiostream_ckpt.runtime.process import ProcessProfile, apply_process_profile
from aiostream_ckpt.runtime.task import StreamTask
from aiostream_ckpt.runtime.workers.attempt import AttemptSetup, AttemptThreads, build_tasks
from aiostream_ckpt.runtime.workers.worker_group import WorkerGroup
from aiostream_ckpt.runtime.workers.worker_metrics import WorkerReports
from aiostream_ckpt.runtime.workers.worker_process import EarlyWorkers, WorkerLaunch
from aiostream_ckpt.state import local_dirs

log = logging.getLogger(__name__)


class JobStatus(Enum):
    """What the job is doing, or how it ended.

    ``finished``: its input ended (bounded sources) and its output is
    committed (Flink's FINISHED). ``stopped_with_savepoint``: a
    stop-with-savepoint ended it, its output committed up to the savepoint, to
    be resumed from it (Flink also reports FINISHED then, its tasks having
    finished; here its input has not ended, so it says what happened).
    ``canceled``: cancelled (``POST /job/cancel``, a signal): the newest
    checkpoint is where a resume starts.
    """

    CREATED = "created"
    RUNNING = "running"
    RESTARTING = "restarting"
    FINISHED = "finished"
    STOPPED_WITH_SAVEPOINT = "stopped_with_savepoint"
    CANCELED = "canceled"
    FAILED = "failed"

    @property
    def ended_well(self) -> bool:
        """Whether the job ended as asked (the CLI exits 0): not failed, not still running."""
        return self in (JobStatus.FINISHED, JobStatus.STOPPED_WITH_SAVEPOINT, JobStatus.CANCELED)


@dataclass
class JobResult:
    status: JobStatus
    restarts: int
    last_checkpoint: int | None
    failure: BaseException | None = None


@dataclass
class JobRun:
    """Live view of a running job for progress lines, REST and tests."""

    status: JobStatus = JobStatus.CREATED
    attempt: int = 0
    restarts: int = 0
    tasks: list[StreamTask] = field(default_factory=list)
    coordinator: CheckpointCoordinator | None = None
    #: the subtasks run by worker processes (``job.workers`` > 1), as they reported them
    workers: WorkerReports | None = None
    #: the worker processes running the tasks (``job.workers`` > 1; ``tasks`` is then empty)
    group: WorkerGroup | None = None
    #: the checkpoint or savepoint this attempt restored (None: a fresh start)
    restored: CompletedCheckpoint | None = None

    def source_records(self) -> int:
        """Count the records the sources read in this attempt, here and in the workers."""
        local = sum(t.metrics.records_in for t in self.tasks if t.spec.reader is not None)
        return local + (self.workers.source_records() if self.workers is not None else 0)

    def last_checkpoint(self) -> int | None:
        c = self.coordinator
        return c.latest_completed.checkpoint_id if c and c.latest_completed else None

    def last_committed(self) -> int | None:
        """Return the newest checkpoint every task committed the output of (its sinks, notified).

        With worker processes, what every worker confirmed; None until each task has one.
        """
        if self.group is not None:
            return self.group.committed()
        notified = [t.metrics.last_notified_checkpoint for t in self.tasks]
        if not notified or any(n is None for n in notified):
            return None
        return min(n for n in notified if n is not None)

    def request_roll(self) -> None:
        """Have rolling file sinks close their open part files at the next checkpoint."""
        if self.group is not None:
            self.group.request_roll()
        for t in self.tasks:
            t.request_roll()


class JobRunner:
    """Runs one job until it finishes, is cancelled, or fails for good."""

    def __init__(
        self,
        spec: JobSpec,
        *,
        clock: Clock | None = None,
        on_started: Callable[[JobRun], None] | None = None,
        process: ProcessProfile | None = None,
        launch: WorkerLaunch | None = None,
        early: EarlyWorkers | None = None,
    ) -> None:
        self.spec = spec
        #: applied by :meth:`run`, whatever the entry point (``docs/performance.md``)
        self.process = process or ProcessProfile()
        self.config = spec.config.validate()
        if self.config.checkpoint.directory is None:
            raise ConfigError("checkpoint.dir is not set: the job needs a checkpoint directory")
        #: how worker processes build this job (``job.workers`` > 1): its app module
        self.launch = _check_launch(self.config.workers, launch)
        #: the first attempt's workers, started before this job was built (``aiostream-ckpt run``)
        self._early = early
        self.clock = clock or SystemClock()
        #: where each attempt claims its working-state directory (see :mod:`.local_dirs`)
        self.local_root = self.config.local_state_root()
        #: one owner per directory: held while :meth:`run` runs (the daemon may hold them longer)
        self.locks = DirectoryLocks(spec.job_name, job_directories(spec))
        checkpoints = self.config.checkpoint_dir()
        assert checkpoints is not None
        self.storage = open_storage(
            checkpoints,
            self.config.checkpoint_location(),
            self.config.s3,
            job_name=spec.job_name,
            retained=self.config.checkpoint.retained,
        )
        self.run_state = JobRun()
        self._on_started = on_started
        self.restore_points = RestorePoints(self.storage, self.config.restore_from)
        self._cancel = asyncio.Event()
        #: how a cancelled run ended (see :meth:`cancel`)
        self._stopped_as = JobStatus.CANCELED
        #: ids used so far in this process (savepoints leave no chk-N directory behind)
        self._next_id_floor = 1

    def cancel(self, status: JobStatus = JobStatus.CANCELED) -> None:
        """Stop the job (e.g. on SIGTERM); the checkpoints stay for a later resume.

        ``status`` says how it ended unless it reaches its end first
        (``stopped_with_savepoint`` for a stop-with-savepoint); the first
        stop's word stays (a cancel after a stop-with-savepoint does not undo
        its savepoint).
        """
        if not self._cancel.is_set():
            self._stopped_as = status
        self._cancel.set()

    # -- restore point ----------------------------------------------------------------

    def _check_state_matches(self, restored: CompletedCheckpoint) -> None:
        """Refuse state for operators the job does not have, unless told to drop it.

        Checkpoints of another job (another name) in ``checkpoint.dir``: dropping
        their state would mix two jobs' checkpoints in one directory, so that case
        names both jobs and asks for a directory of this job's own.
        """
        uids = {t.uid for t in self.spec.transformations}
        unknown = sorted(set(restored.operators) - uids)
        if not unknown:
            return
        kind = "savepoint" if restored.is_savepoint else "checkpoint"
        if restored.job_name != self.spec.job_name and not restored.is_savepoint:
            raise StateMigrationError(
                f"checkpoint.dir {self.storage.root} holds checkpoints of job "
                f"{restored.job_name!r} (with operators {', '.join(sorted(restored.operators))}),"
                f" not of job {self.spec.job_name!r}: give each job "
                "its own checkpoint.dir (to carry state over from another job, take a "
                "savepoint of it and start this job from it in a fresh checkpoint.dir)"
            )
        if not self.config.allow_non_restored_state:
            raise StateMigrationError(
                f"{kind} {restored.checkpoint_id} has state for operators not in the job: "
                f"{', '.join(unknown)} (run with --allow-non-restored-state to drop it)"
            )
        log.warning(
            "--allow-non-restored-state: dropping the state of %s %d for operator(s) not in "
            "the job: %s",
            kind,
            restored.checkpoint_id,
            ", ".join(unknown),
        )

    # -- running ----------------------------------------------------------------------

    async def run(self) -> JobResult:
        """Run attempts until the job ends, owning its directories throughout.

        The locks come before anything is restored or written; a directory
        owned by another job refuses this start (``DirectoryOwnedError``).
        """
        apply_process_profile(self.process)
        with self.locks:
            try:
                check_shard_layout(self.config)
                if isinstance(self.storage, ObjectCheckpointStorage):
                    # the object store's one owner: claimed before anything is restored
                    await asyncio.to_thread(self.storage.claim)
                return await self._run_attempts()
            finally:
                if self.run_state.status is JobStatus.CREATED:  # refused: no attempt ran
                    self.locks.leave_no_trace()
                if isinstance(self.storage, ObjectCheckpointStorage):
                    self.storage.close()

    async def _run_attempts(self) -> JobResult:
        strategy = restart_strategy(self.config.restart, self.clock)
        chains = plan_chains(self.spec.transformations, self.config)
        if self.launch is not None:
            self.launch = place_workers(self.launch, chains)
        run = self.run_state
        while True:
            restored = await self._choose(run.attempt)
            run.restored = restored
            if restored is not None:
                self._check_state_matches(restored)
                log.info(
                    "restoring from %s %d (%s)",
                    "savepoint" if restored.is_savepoint else "checkpoint",
                    restored.checkpoint_id,
                    restored.directory,
                )
            run.status = JobStatus.RUNNING
            try:
                finished = await self._run_attempt(chains, restored, run.attempt)
            except CorruptCheckpointError as exc:
                if restored is not None and self.restore_points.is_stop_savepoint(restored):
                    self.restore_points.set_aside_stop_savepoint(str(exc))
                    continue
                if restored is None or restored.is_savepoint:
                    raise JobFailedError(f"cannot restore: {exc}", exc) from exc
                log.error(
                    "checkpoint %d cannot be restored (%s); falling back to the previous one",
                    restored.checkpoint_id,
                    exc,
                )
                self.restore_points.set_aside(restored.checkpoint_id, str(exc))
                continue
            except RestoreRefusedError as exc:
                run.status = JobStatus.FAILED
                raise JobFailedError(f"cannot restore: {exc}", exc) from exc
            except Exception as exc:
                delay = strategy.next_delay(exc)
                if delay is None:
                    run.status = JobStatus.FAILED
                    line = _failure_line(self.spec.job_name, strategy, exc)
                    detail = exc.detail if isinstance(exc, AiostreamError) else None
                    raise JobFailedError(line, exc, detail=detail) from exc
                run.status = JobStatus.RESTARTING
                run.restarts = strategy.restarts
                log.warning(
                    "job %r failed (%s); restart %d in %.1fs%s",
                    self.spec.job_name,
                    _cause(exc),
                    strategy.restarts,
                    delay,
                    # the app's traceback at the default level (the whole one at DEBUG)
                    "\n" + exc.detail if isinstance(exc, UserFunctionError) and exc.detail else "",
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )
                await self.clock.sleep(delay)
                run.attempt += 1
                continue
            run.status = JobStatus.FINISHED if finished else self._stopped_as
            last = await asyncio.to_thread(self.storage.latest_valid)
            return JobResult(run.status, strategy.restarts, last.checkpoint_id if last else None)

    async def _choose(self, attempt: int) -> CompletedCheckpoint | None:
        """Choose the restore point; from an object store, in a thread (it downloads)."""
        storage = self.storage
        if not isinstance(storage, ObjectCheckpointStorage):
            return self.restore_points.choose()

        def choose() -> CompletedCheckpoint | None:
            storage.begin_attempt(attempt)
            return self.restore_points.choose()

        return await asyncio.to_thread(choose)

    async def _run_attempt(
        self, chains: list[Chain], restored: CompletedCheckpoint | None, attempt: int
    ) -> bool:
        """One attempt; True when the job reached its end, False when cancelled."""
        config = self.config
        self.storage.discard_incomplete()
        local = local_dirs.claim(self.local_root)
        local_dir = local.path
        threads = AttemptThreads()
        coordinator = CheckpointCoordinator(
            job_name=self.spec.job_name,
            config=config.checkpoint,
            storage=self.storage,
            clock=self.clock,
            executor=threads.snapshot,
            max_parallelism=config.max_parallelism,
            first_checkpoint_id=self._first_checkpoint_id(restored),
        )
        if restored is not None and not restored.is_savepoint:
            coordinator.latest_completed = restored
        fallback = restored is None and self.restore_points.after_set_aside()
        restore = restore_info(
            restored,
            fallback=fallback,
            storage=self.storage,
            allow_duplicates=config.allow_duplicate_output,
        )
        setup = AttemptSetup(
            job_name=self.spec.job_name,
            config=config,
            params=dict(self.spec.params),
            clock=self.clock,
            attempt=attempt,
            restored=restored,
            restore=restore,
            fallback=fallback,
            local_dir=local_dir,
        )
        tasks: list[StreamTask] = []
        committers = GlobalCommitters(
            self.spec, attempt=attempt, restore=restore, executor=threads.io
        )
        committers.register(coordinator)
        try:
            if config.workers > 1:
                return await self._run_workers(setup, chains, coordinator, committers)
            tasks = build_tasks(setup, chains, coordinator, threads)
            self.run_state.tasks = tasks
            self.run_state.coordinator = coordinator
            if self._on_started is not None:
                self._on_started(self.run_state)
            try:
                await restore_tasks(
                    tasks,
                    restored,
                    coordinator,
                    allow_retract=config.allow_retract_output,
                    allow_duplicates=config.allow_duplicate_output,
                    committers=committers,
                    recover_id=recover_checkpoint_id(restored, fallback=fallback),
                )
            except BaseException:
                await asyncio.gather(*(t.close() for t in tasks), return_exceptions=True)
                raise
            return await self._supervise(coordinator, [(t.task_id, t.run()) for t in tasks])
        finally:
            self._next_id_floor = max(self._next_id_floor, coordinator.next_checkpoint_id)
            await committers.close()
            threads.shutdown()
            local.release()

    def _first_checkpoint_id(self, restored: CompletedCheckpoint | None) -> int:
        """Continue after the restored id (as Flink does after a savepoint).

        Sinks name committed output by checkpoint id, so a job restored from
        savepoint n into a fresh checkpoint directory must not start again at 1.
        """
        after_restored = restored.checkpoint_id + 1 if restored is not None else 1
        return max(self.storage.next_checkpoint_id(), after_restored, self._next_id_floor)

    async def _run_workers(
        self,
        setup: AttemptSetup,
        chains: list[Chain],
        coordinator: CheckpointCoordinator,
        committers: GlobalCommitters,
    ) -> bool:
        """Run the attempt in ``job.workers`` worker processes (see ``workers.worker_group``)."""
        assert self.launch is not None  # checked at construction
        spawned = await self._early.take(self.launch) if self._early is not None else None
        group = WorkerGroup(
            self.launch,
            self.spec.transformations,
            chains,
            coordinator,
            self.storage,
            attempt=setup.attempt,
            start_timeout=self.config.worker_start_timeout,
            restore_timeout=self.config.worker_restore_timeout,
            heartbeat_timeout=self.config.heartbeat_timeout,
            clock=self.clock,
            spawned=spawned,
        )
        self.run_state.coordinator = coordinator
        self.run_state.workers = group.reports
        self.run_state.group = group
        if self._on_started is not None:
            self._on_started(self.run_state)
        async with group:
            await group.start()
            self.storage.remote_pins = group.remote_pins
            try:
                recover_id = recover_checkpoint_id(setup.restored, fallback=setup.fallback)
                surveys = await group.restore(setup)
                surveys += await committers.surveys(setup.restored, recover_id)
                highest = decide_restore(
                    surveys,
                    setup.restored,
                    allow_retract=self.config.allow_retract_output,
                    allow_duplicates=self.config.allow_duplicate_output,
                )
                coordinator.skip_ids_through(highest)
                await committers.recover(setup.restored, recover_id)
                await group.recover()
                return await self._supervise(coordinator, [("workers", group.run())], group.failure)
            finally:
                self.storage.remote_pins = None

    async def _supervise(
        self,
        coordinator: CheckpointCoordinator,
        runs: list[tuple[str, Coroutine[Any, Any, None]]],
        failure: asyncio.Future[BaseException] | None = None,
    ) -> bool:
        """Run ``runs`` (the tasks, or the workers) under the coordinator until all end.

        ``failure``: resolves to an error that fails the attempt (a worker's).
        """
        async with coordinator:
            running = [asyncio.create_task(run, name=name) for name, run in runs]
            cancel_wait = asyncio.ensure_future(self._cancel.wait())
            watch: set[asyncio.Future[Any]] = {*running, coordinator.failure, cancel_wait}
            if failure is not None:
                watch.add(failure)
            try:
                while True:
                    done, _ = await asyncio.wait(watch, return_when=asyncio.FIRST_COMPLETED)
                    if coordinator.failure in done:
                        raise coordinator.failure.result()
                    if failure is not None and failure in done:
                        raise failure.result()
                    if cancel_wait in done:
                        return False
                    for t in done:
                        watch.discard(t)
                        exc = t.exception()
                        if exc is not None:
                            raise exc
                    if not any(t in watch for t in running):
                        return True
            finally:
                cancel_wait.cancel()
                for t in running:
                    t.cancel()
                await asyncio.gather(*running, cancel_wait, return_exceptions=True)


def _check_launch(workers: int, launch: WorkerLaunch | None) -> WorkerLaunch | None:
    if workers == 1:
        return None
    if launch is None:
        raise ConfigError(
            f"job.workers={workers} needs the job run from its app module "
            "(aiostream-ckpt run MODULE): each worker process builds the job from it"
        )
    if launch.workers != workers:
        raise ConfigError(f"job.workers={workers} but the workers were told {launch.workers}")
    return launch


def place_workers(launch: WorkerLaunch, chains: list[Chain]) -> WorkerLaunch:
    """Start no more workers than the widest chain has subtasks: the others would idle.

    Subtask i runs in worker i % workers, so a job whose operators all run
    at parallelism 1 runs in worker 0, as Flink places it in one slot and
    leaves the others free.
    """
    widest = max(c.parallelism for c in chains)
    if launch.workers <= widest:
        return launch
    log.info(
        "job.workers=%d: the job's widest operator runs %d subtask(s), so %d worker "
        "process(es) run it; more would have no subtask",
        launch.workers,
        widest,
        widest,
    )
    return dataclasses.replace(launch, workers=widest)


def _failure_line(job_name: str, strategy: RestartStrategy, exc: BaseException) -> str:
    """Say how many restarts were done, why no further one, then the cause."""
    n = strategy.restarts
    after = "" if isinstance(strategy, NoRestart) else f" after {n} restart{'' if n == 1 else 's'}"
    return f"job {job_name!r} failed{after} ({strategy.give_up_reason(exc)}): {_cause(exc)}"


def _cause(exc: BaseException) -> str:
    """Say the exception in one line (a user function's error names its own type)."""
    if isinstance(exc, UserFunctionError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def run_job(spec: JobSpec, *, clock: Clock | None = None) -> JobResult:
    """Run the job ``spec`` describes to completion on uvloop (blocking)."""
    import uvloop

    async def main() -> JobResult:
        return await JobRunner(spec, clock=clock).run()

    result: JobResult = uvloop.run(main())
    return result
