"""The CheckpointCoordinator: triggers barriers, collects acks, completes checkpoints.

Checkpoint n is *complete* only once every task has acknowledged it and its
metadata is durable on disk; only then are tasks told, and only then do sinks
commit. Knobs follow Flink: interval, timeout, max concurrent, min pause,
tolerable consecutive failures, retained checkpoints. A failed or expired
checkpoint is discarded with its files and the job goes on, unless too many
fail in a row: then :attr:`failure` is set and the job fails over.

Here: when to trigger, and what each ack, decline, timeout, completion and
abort does. The books of the checkpoints in flight are ``pending.py``'s, the
metadata a completion writes is built by ``metadata.py``, the entries the
REST API lists by ``history.py``.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from aiostream_ckpt import failpoints
from aiostream_ckpt.aio import BackgroundTasks, to_the_end
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier, CheckpointKind
from aiostream_ckpt.checkpoint.config import CheckpointConfig
from aiostream_ckpt.checkpoint.history import aborted_entry, alignment, completed_entry
from aiostream_ckpt.checkpoint.metadata import (
    METADATA_FILE,
    AbortReason,
    CheckpointStatus,
    CompletedCheckpoint,
    PendingCheckpoint,
    TaskAck,
)
from aiostream_ckpt.checkpoint.participants import (
    CheckpointCommitter,
    CheckpointListener,
    TriggerTarget,
)
from aiostream_ckpt.checkpoint.pending import PendingCheckpoints
from aiostream_ckpt.checkpoint.storage import CheckpointStorage, savepoint_target
from aiostream_ckpt.clock import Clock
from aiostream_ckpt.errors import CheckpointError, CheckpointOutcomeUnknownError, FencedError
from aiostream_ckpt.state.backend import SnapshotTarget

log = logging.getLogger(__name__)


class CheckpointCoordinator:
    """One per job run. Start it with ``async with`` or :meth:`start`/:meth:`stop`."""

    def __init__(
        self,
        *,
        job_name: str,
        config: CheckpointConfig,
        storage: CheckpointStorage,
        clock: Clock,
        executor: Executor,
        max_parallelism: int,
        first_checkpoint_id: int,
    ) -> None:
        self.job_name = job_name
        self.config = config
        self.storage = storage
        self._clock = clock
        self._executor = executor
        self._max_parallelism = max_parallelism
        self._next_id = first_checkpoint_id
        self._tasks: list[str] = []
        self._sources: dict[str, TriggerTarget] = {}
        self._listeners: list[CheckpointListener] = []
        self._committers: list[CheckpointCommitter] = []
        #: the newest savepoint completed in this run, for stop-with-savepoint's global commit
        self._savepoints: dict[int, CompletedCheckpoint] = {}
        self._finished_sources: set[str] = set()
        self._pending = PendingCheckpoints()
        self._consecutive_failures = 0
        self._last_completion = -float("inf")
        self._slot_free = asyncio.Event()
        self._bg = BackgroundTasks(self._fail)
        self._finalize_lock = asyncio.Lock()
        self._periodic: asyncio.Task[None] | None = None
        self._started = False
        self._final_pending = False
        self._suspended = False
        #: a savepoint completed since the last checkpoint: its output awaits the next one
        self._savepoint_uncommitted: int | None = None
        self.latest_completed: CompletedCheckpoint | None = None
        #: Set when the job must fail over (too many checkpoint failures, storage dead).
        self.failure: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        #: Set when a checkpoint taken after every source finished has completed.
        self.finished: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        #: Called with each checkpoint's history entry; the job's history (the REST API's
        #: ``JobStats``) keeps them, the coordinator keeps none: a second copy only grew RSS.
        self.on_history: Callable[[dict[str, Any]], None] | None = None

    # -- wiring ---------------------------------------------------------------------

    def register_task(self, task_id: str, listener: CheckpointListener) -> None:
        self._tasks.append(task_id)
        self._listeners.append(listener)

    def register_source(self, task_id: str, source: TriggerTarget) -> None:
        self._sources[task_id] = source

    def register_committer(self, committer: CheckpointCommitter) -> None:
        """Run ``committer`` for each completed checkpoint, before the tasks are notified."""
        self._committers.append(committer)

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self.config.interval > 0:
            first = self._clock.monotonic() + self.config.interval
            self._periodic = asyncio.create_task(self._run_periodic(first), name="checkpoint-timer")

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        if self._periodic is not None:
            self._periodic.cancel()
            await asyncio.gather(self._periodic, return_exceptions=True)
        await self._bg.cancel_all()
        for cid in self._pending.ids():
            self._abort(cid, AbortReason.JOB_STOPPING, count=False)

    async def __aenter__(self) -> CheckpointCoordinator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _fail(self, exc: BaseException) -> None:
        if not self.failure.done():
            self.failure.set_result(exc)

    # -- triggering -----------------------------------------------------------------

    async def _run_periodic(self, next_at: float) -> None:
        interval = self.config.interval
        while not self._final_pending:
            await self._clock.sleep(next_at - self._clock.monotonic())
            while self._pending.regular_count() >= self.config.max_concurrent or (
                self.config.unaligned and self._pending.savepoint_count()
            ):  # an unaligned barrier would overtake the savepoint's: it could never align
                self._slot_free.clear()
                await self._slot_free.wait()
            earliest = self._last_completion + self.config.min_pause
            if self._clock.monotonic() < earliest:
                await self._clock.sleep(earliest - self._clock.monotonic())
            if self._final_pending:
                return
            if not self._suspended:
                self.trigger()
            next_at = max(self._clock.monotonic(), next_at + interval)

    def trigger(
        self, *, savepoint_dir: Path | None = None, final: bool = False
    ) -> asyncio.Future[CompletedCheckpoint]:
        """Inject barrier n at every source now; the future resolves when n completes."""
        cid = self._next_id
        is_savepoint = savepoint_dir is not None
        if is_savepoint:  # a savepoint leaves no chk-N behind: its id must not come back
            self.storage.note_savepoint_id(cid)
        self._next_id += 1
        pending = PendingCheckpoint(
            checkpoint_id=cid,
            is_savepoint=is_savepoint,
            trigger_wall_time=self._clock.time(),
            trigger_monotonic=self._clock.monotonic(),
            tasks_to_ack=set(self._tasks),
            is_final=final,
        )
        fut = self._pending.add(pending, savepoint_dir)
        kind = CheckpointKind.SAVEPOINT if is_savepoint else CheckpointKind.CHECKPOINT
        # savepoints are always aligned; so is the final checkpoint: it must commit every
        # record, and an unaligned barrier would leave those it overtook in its channel state
        may_overtake = self.config.unaligned and not is_savepoint and not final
        timeoutable = may_overtake and self.config.aligned_timeout > 0  # aligned first
        barrier = CheckpointBarrier(
            cid, pending.trigger_wall_time, kind, may_overtake and not timeoutable, timeoutable
        )
        log.debug("triggering %s %d", kind.value, cid)
        deadline = pending.trigger_monotonic + self.config.timeout
        self._pending.expire_with(
            cid, self._bg.spawn(self._expire_at(cid, deadline), f"checkpoint-{cid}-timeout")
        )
        for source in self._sources.values():
            source.trigger_checkpoint(barrier)
        if is_savepoint:
            failpoints.hit("savepoint_triggered")
        return fut

    def source_finished(self, task_id: str) -> None:
        """Note a bounded source reached its end; once all have, take the final checkpoint."""
        self._finished_sources.add(task_id)
        self._maybe_trigger_final()

    def _maybe_trigger_final(self) -> None:
        all_done = self._finished_sources >= set(self._sources)
        if all_done and not self._final_pending and not self._suspended:
            self._final_pending = True
            self.trigger(final=True)

    def suspend_triggers(self) -> None:
        """Trigger no periodic or final checkpoint until :meth:`resume_triggers`.

        Stop-with-savepoint needs this: a checkpoint completing after the
        savepoint would commit output the restored job produces again.
        """
        self._suspended = True

    def resume_triggers(self) -> None:
        """Undo :meth:`suspend_triggers` (the stop failed and the job goes on)."""
        self._suspended = False
        self._maybe_trigger_final()

    async def commit_savepoint(self, checkpoint_id: int) -> None:
        """Tell every task that savepoint ``checkpoint_id`` completed: sinks commit its output.

        Only for stop-with-savepoint, as Flink does for a synchronous savepoint
        (the stopped job's output is complete): no checkpoint may follow it,
        and the caller first records it as the job's restore point
        (:meth:`CheckpointStorage.record_stop_savepoint`). The global
        committers commit first; one that fails leaves the output to the
        restore of the savepoint, and raises.
        """
        completed = self._savepoints.get(checkpoint_id)
        if completed is not None:
            for committer in self._committers:
                await committer.commit_checkpoint(completed)
        for listener in self._listeners:
            listener.notify_checkpoint_complete(checkpoint_id)

    def skip_ids_through(self, checkpoint_id: int) -> None:
        """Start above ``checkpoint_id`` (output is named by it already); only before start."""
        if self._started:
            raise CheckpointError("checkpoint ids can be skipped only before the first trigger")
        self._next_id = max(self._next_id, checkpoint_id + 1)

    @property
    def next_checkpoint_id(self) -> int:
        """The id the next trigger will use; ids never repeat within a job."""
        return self._next_id

    # -- targets, acks, declines ----------------------------------------------------

    def snapshot_target(self, checkpoint_id: int, uid: str, subtask: int) -> SnapshotTarget:
        """Where ``uid``'s instance ``subtask`` writes n; refused once n ended (the task declines).

        A task reaches n's barrier late when n was aborted meanwhile (expired,
        declined by another task): its files would land in a directory that
        the abort already removed, and stay there until the next attempt.
        """
        pending = self._pending.get(checkpoint_id)
        if pending is None or pending.status is not CheckpointStatus.PENDING:
            raise CheckpointError(f"checkpoint {checkpoint_id} has ended: nothing to write")
        sp = self._pending.savepoint_dir(checkpoint_id)
        if sp is None:
            return self.storage.target(checkpoint_id, uid, subtask)
        return savepoint_target(sp, checkpoint_id, uid, subtask)

    def savepoint_dir(self, checkpoint_id: int) -> Path | None:
        """Where savepoint ``checkpoint_id`` goes; None when it is a checkpoint."""
        return self._pending.savepoint_dir(checkpoint_id)

    def acknowledge(self, checkpoint_id: int, ack: TaskAck) -> None:
        pending = self._pending.get(checkpoint_id)
        if pending is None:
            self._discard_late(checkpoint_id)
            return
        if pending.status is not CheckpointStatus.PENDING:
            return
        if ack.task_id not in pending.tasks_to_ack:
            return
        pending.tasks_to_ack.discard(ack.task_id)
        pending.acks[ack.task_id] = ack
        if pending.fully_acknowledged:
            self._bg.spawn(self._complete(pending), f"checkpoint-{checkpoint_id}-complete")

    def decline(self, checkpoint_id: int, task_id: str, reason: BaseException) -> None:
        if checkpoint_id in self._pending:
            log.warning("checkpoint %d declined by %s: %s", checkpoint_id, task_id, reason)
            self._abort(checkpoint_id, AbortReason.DECLINED, detail=str(reason))
        else:
            self._discard_late(checkpoint_id)

    def _discard_late(self, checkpoint_id: int) -> None:
        """Remove what a task wrote for n after n ended, unless n completed.

        A task that took its snapshot target before n was aborted writes its
        files afterwards, into the directory the abort removed; its ack (or
        decline) comes after the write, so this removal is the last. A
        completed checkpoint or savepoint has its metadata and is kept: only
        an incomplete chk-N, or an aborted savepoint's directory, goes.
        """
        if checkpoint_id >= self._next_id:
            return  # not one of this attempt's
        self.storage.discard_incomplete(only=checkpoint_id)
        sp = self._pending.savepoint_dir(checkpoint_id)
        if sp is not None and not (sp / METADATA_FILE).exists():
            shutil.rmtree(sp, ignore_errors=True)

    async def _expire_at(self, checkpoint_id: int, deadline: float) -> None:
        await self._clock.sleep(deadline - self._clock.monotonic())
        pending = self._pending.get(checkpoint_id)
        if pending is not None and pending.status is CheckpointStatus.PENDING:
            missing = ", ".join(sorted(pending.tasks_to_ack)) or "(metadata write)"
            log.warning(
                "checkpoint %d expired after %.1fs; not acknowledged by %s",
                checkpoint_id,
                self.config.timeout,
                missing,
            )
            self._abort(checkpoint_id, AbortReason.EXPIRED, detail=f"waiting for {missing}")

    # -- completion -----------------------------------------------------------------

    async def _complete(self, pending: PendingCheckpoint) -> None:
        """Write the metadata of a fully acknowledged checkpoint, then tell the tasks.

        One metadata write or retention pass runs at a time (``_finalize_lock``):
        retention then sees exactly the checkpoints this coordinator completed,
        never one whose metadata a write is still making durable. Once the write
        starts the checkpoint is FINALIZING: no timeout, newer checkpoint or stop
        aborts it, because a durable checkpoint is what the next run restores --
        aborting it would unpin its files and roll back its transactions.
        """
        async with self._finalize_lock:
            if pending.status is not CheckpointStatus.PENDING:
                return  # expired or subsumed while the previous write ran
            pending.transition(CheckpointStatus.FINALIZING)
            cid = pending.checkpoint_id
            sp = self._pending.savepoint_dir(cid)
            directory = sp if sp is not None else self.storage.checkpoint_dir(cid)
            completed = pending.completed(
                self.job_name,
                self._max_parallelism,
                directory,
                completion_time=self._clock.time(),
                duration_seconds=self._clock.monotonic() - pending.trigger_monotonic,
            )
            write = self._in_executor(self.storage.write_completed, completed)
            try:
                await to_the_end(write)
            except CheckpointOutcomeUnknownError as exc:
                # completed or not, the store will say: not aborted (its output would be
                # rolled back), not completed (nothing commits); the job fails over
                log.error("checkpoint %d: %s", cid, exc)
                self._fail(exc)
                return
            except FencedError as exc:
                log.error("checkpoint %d: %s", cid, exc)
                self._abort(cid, AbortReason.STORAGE_FAILED, detail=str(exc), count=False)
                self._fail(exc)
                return
            except CheckpointError as exc:
                log.error("checkpoint %d: %s", cid, exc)
                self._abort(cid, AbortReason.STORAGE_FAILED, detail=str(exc))
                return
            except asyncio.CancelledError:  # the job stops; the write has ended (to_the_end)
                failed = write.cancelled() or write.exception() is not None
                if failed:
                    self._abort(cid, AbortReason.STORAGE_FAILED, detail="while stopping")
                else:  # durable: the next run restores it, as after a crash
                    self._settle_completed(pending, completed, notify=False)
                raise
            if sp is None:
                failpoints.hit("final_metadata_durable" if pending.is_final else "metadata_durable")
                if self._savepoint_uncommitted is not None and cid > self._savepoint_uncommitted:
                    self._savepoint_uncommitted = None
                    failpoints.hit("savepoint_next_metadata_durable")
                if not await self._commit_globally(completed):
                    self._settle_completed(pending, completed, notify=False)
                    return
            else:
                failpoints.hit("savepoint_metadata_durable")
                self._savepoint_uncommitted = cid
            self._settle_completed(pending, completed, notify=True)
            if sp is None:
                retention = self._in_executor(self.storage.apply_retention, self.config.retained)
                await to_the_end(retention)

    async def _commit_globally(self, completed: CompletedCheckpoint) -> bool:
        """Run the global committers (durable checkpoint, no task told yet); False: one failed.

        A failed commit fails the job over without notifying anyone: the
        checkpoint is durable, so the next attempt restores it and its
        committers' recovery commits it again (idempotently).
        """
        for committer in self._committers:
            try:
                await committer.commit_checkpoint(completed)
            except Exception as exc:
                log.error(
                    "checkpoint %d: the global commit of %s failed: %s",
                    completed.checkpoint_id,
                    committer.name,
                    exc,
                )
                self._fail(exc)
                return False
        return True

    def _in_executor(self, fn: Callable[..., None], *args: Any) -> asyncio.Future[None]:
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _settle_completed(
        self, pending: PendingCheckpoint, completed: CompletedCheckpoint, *, notify: bool
    ) -> None:
        """Mark a checkpoint with durable metadata completed; ``notify`` tasks (sinks commit)."""
        cid = pending.checkpoint_id
        sp = self._pending.savepoint_dir(cid)
        pending.transition(CheckpointStatus.COMPLETED)
        self._pending.forget(cid)
        self._slot_free.set()
        self._consecutive_failures = 0
        self._last_completion = self._clock.monotonic()
        self._append_history(completed_entry(completed))
        log.info(
            "%s %d completed in %.0f ms (%d bytes)%s%s",
            "savepoint" if sp else "checkpoint",
            cid,
            completed.duration_seconds * 1000,
            completed.size_bytes,
            _in_flight_note(completed),
            "" if notify else "; the job stops: its sinks commit when the next run restores it",
        )
        waiter = self._pending.take_waiter(cid)
        if sp is not None:
            self._savepoints = {cid: completed}  # the newest: only a stop commits one
        if sp is None:
            self.latest_completed = completed
            for older in self._pending.regular_before(cid):
                self._abort(older, AbortReason.SUBSUMED, count=False)
            if notify:
                for listener in self._listeners:
                    listener.notify_checkpoint_complete(cid)
        if waiter is not None and not waiter.done():
            waiter.set_result(completed)
        if notify and pending.is_final and not self.finished.done():
            self.finished.set_result(cid)

    # -- aborts ---------------------------------------------------------------------

    def _abort(
        self, checkpoint_id: int, reason: AbortReason, *, detail: str = "", count: bool = True
    ) -> None:
        pending = self._pending.get(checkpoint_id)
        if pending is None:
            return
        finalizing = pending.status is CheckpointStatus.FINALIZING
        if finalizing and reason is not AbortReason.STORAGE_FAILED:
            return  # its metadata write decides (see _complete)
        self._pending.forget(checkpoint_id)
        pending.transition(CheckpointStatus.ABORTED)
        self._slot_free.set()
        # a savepoint's directory is its caller's to remove; a chk-N of its id (a
        # worker's task that learned of the abort before the savepoint's directory)
        # is not left behind either
        self.storage.discard(checkpoint_id)
        self._append_history(aborted_entry(pending, reason, detail))
        for listener in self._listeners:
            listener.notify_checkpoint_aborted(checkpoint_id)
        waiter = self._pending.take_waiter(checkpoint_id)
        err = CheckpointError(
            f"checkpoint {checkpoint_id} aborted: {reason.value} {detail}".strip()
        )
        if waiter is not None and not waiter.done():
            waiter.set_exception(err)
            waiter.exception()  # mark retrieved: nobody may be waiting on a periodic one
        if pending.is_final and self._started:
            self._final_pending = False
            self._bg.spawn(self._retrigger_final(), "final-checkpoint-retry")
        if count and not pending.is_savepoint:
            self._consecutive_failures += 1
            if self._consecutive_failures > self.config.tolerable_failures:
                self._fail(
                    CheckpointError(
                        f"{self._consecutive_failures} consecutive checkpoint failures exceed "
                        f"tolerable_failures={self.config.tolerable_failures}; last: {err}"
                    )
                )

    async def _retrigger_final(self) -> None:
        await self._clock.sleep(max(self.config.min_pause, 0.05))
        self._maybe_trigger_final()

    # -- history --------------------------------------------------------------------

    def _append_history(self, entry: dict[str, Any]) -> None:
        if self.on_history is not None:
            self.on_history(entry)

    @property
    def pending_ids(self) -> Sequence[int]:
        return self._pending.ids()


def _in_flight_note(completed: CompletedCheckpoint) -> str:
    """``; unaligned, N in-flight records (B bytes)`` when some task took it unaligned."""
    how = alignment(completed)
    if not how["unaligned"]:
        return ""
    records, size = how["in_flight_records"], how["in_flight_bytes"]
    return f"; unaligned, {records} in-flight records ({size} bytes)"
