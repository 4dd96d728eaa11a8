"""Savepoints, stop-with-savepoint and the graceful stops behind SIGTERM.

A savepoint is a checkpoint triggered by hand into its own self-contained
directory (the coordinator writes every state file and the ``_metadata``
there; retention never touches it). Sinks are *not* told an intermediate
savepoint completed, as in Flink: their pre-committed output stays pending and
is committed by the next regular checkpoint.

Stop-with-savepoint first suspends periodic checkpoints: a checkpoint
completing after the savepoint would commit output that the job restored from
the savepoint produces again (a file sink can retract it on recovery, a Kafka
transaction cannot). Then, as Flink does, the sinks commit the savepoint's
output, so a stopped job's output is complete: the savepoint is first
recorded in the checkpoint directory as the job's newest restore point, so a
restart there resumes from it rather than retracting that output. Records
processed after the savepoint's barrier are only ever in open transactions,
which the cancellation discards.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiostream_ckpt.checkpoint.coordinator import CheckpointCoordinator
from aiostream_ckpt.daemon.metrics import JobStats
from aiostream_ckpt.daemon.peers import outlive
from aiostream_ckpt.daemon.savepoint_disposal import (
    SavepointDisposalError,
    dispose_directory,
    find_savepoint,
)
from aiostream_ckpt.daemon.settings import ShutdownMode
from aiostream_ckpt.errors import AiostreamError, CheckpointError
from aiostream_ckpt.runtime.job import JobRunner, JobStatus

log = logging.getLogger(__name__)

#: How long a graceful stop waits for the sinks to act on a completed checkpoint.
COMMIT_WAIT_SECONDS = 10.0
#: How long the answer to a stop-with-savepoint waits for the job to have ended.
STOP_ANSWER_WAIT_SECONDS = 60.0
#: How long a daemon that is PID 1 outlives the clients that asked it to stop.
CLIENT_EXIT_GRACE_SECONDS = 5.0


class JobNotRunningError(AiostreamError):
    """The request needs a running job (it is restarting, stopping or done)."""


@dataclass(frozen=True)
class SavepointResult:
    checkpoint_id: int
    path: Path
    duration_ms: float
    size_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.checkpoint_id,
            "path": str(self.path),
            "duration_ms": round(self.duration_ms, 1),
            "size_bytes": self.size_bytes,
        }


class SavepointService:
    """Triggers savepoints and stops the job of one :class:`JobRunner`."""

    def __init__(self, runner: JobRunner, stats: JobStats, default_dir: Path) -> None:
        self._runner = runner
        self._stats = stats
        self.default_dir = default_dir
        self._lock = asyncio.Lock()
        self.stopping = False
        #: the savepoint a stop-with-savepoint ended the job with
        self.final_savepoint: SavepointResult | None = None
        #: the savepoints this daemon took, by id (``dispose`` finds them by it)
        self._taken: dict[int, Path] = {}
        #: the stop-with-savepoint's output is committed (the sinks confirmed it)
        self.final_committed = False
        #: how the job ended, once it has (the answer to a stop waits for it)
        self._ended: asyncio.Future[JobStatus] | None = None
        #: stop answers being written, and the clients to outlive (see :mod:`.peers`)
        self._answering = 0
        self._answered = asyncio.Event()
        self._clients: set[int] = set()

    def _coordinator(self) -> CheckpointCoordinator:
        run = self._runner.run_state
        if self.stopping:
            raise JobNotRunningError("the job is stopping")
        if run.status is not JobStatus.RUNNING or run.coordinator is None:
            raise JobNotRunningError(f"the job is {run.status.value}, not running")
        return run.coordinator

    def _new_dir(self, directory: str | Path | None) -> Path:
        base = Path(directory).expanduser() if directory else self.default_dir
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
        name = f"savepoint-{self._runner.spec.job_name}-{stamp}-{secrets.token_hex(3)}"
        path = base.resolve() / name
        try:
            path.mkdir(parents=True)
        except OSError as exc:
            raise CheckpointError(f"cannot create savepoint directory {path}: {exc}") from exc
        return path

    async def _take(
        self, coordinator: CheckpointCoordinator, directory: str | Path | None
    ) -> SavepointResult:
        path = self._new_dir(directory)
        try:
            completed = await coordinator.trigger(savepoint_dir=path)
        except BaseException as exc:
            # a failed savepoint must not look like one: remove what was written
            shutil.rmtree(path, ignore_errors=True)
            log.error("savepoint into %s failed: %s", path, exc)
            raise
        result = SavepointResult(
            completed.checkpoint_id, path, completed.duration_seconds * 1000, completed.size_bytes
        )
        self._taken[result.checkpoint_id] = path
        log.info(
            "savepoint %d stored at %s (%.0f ms, %d bytes)",
            result.checkpoint_id,
            path,
            result.duration_ms,
            result.size_bytes,
        )
        return result

    async def trigger(self, directory: str | Path | None = None) -> SavepointResult:
        """Take a savepoint while the job goes on."""
        async with self._lock:
            return await self._take(self._coordinator(), directory)

    async def stop_with_savepoint(self, directory: str | Path | None = None) -> SavepointResult:
        """Savepoint, then cancel the job (exit 0); on failure the job goes on."""
        async with self._lock:
            coordinator = self._coordinator()
            coordinator.suspend_triggers()
            try:
                result = await self._take(coordinator, directory)
            except BaseException:
                coordinator.resume_triggers()
                raise
            self.stopping = True
            self.final_savepoint = result
            await self._commit_savepoint(coordinator, result)
            log.info(
                "stop-with-savepoint: savepoint %d at %s; stopping the job",
                result.checkpoint_id,
                result.path,
            )
            self._runner.cancel(JobStatus.STOPPED_WITH_SAVEPOINT)
            return result

    async def _commit_savepoint(
        self, coordinator: CheckpointCoordinator, result: SavepointResult
    ) -> None:
        """Commit the savepoint's output once it is the directory's restore point."""
        storage = self._runner.storage
        try:
            await asyncio.to_thread(
                storage.record_stop_savepoint, result.path, result.checkpoint_id
            )
        except CheckpointError as exc:  # still exact: a restore from it commits the output
            log.error("stop-with-savepoint: %s; its output stays pre-committed", exc)
            return
        try:
            await coordinator.commit_savepoint(result.checkpoint_id)
        except Exception as exc:  # still exact: a restore from it commits the output
            log.error("stop-with-savepoint: %s; its output stays pre-committed", exc)
            return
        self.final_committed = await self._wait_committed(result.checkpoint_id)

    # -- the answer to a stop, and the client that asked -----------------------------

    def _ended_future(self) -> asyncio.Future[JobStatus]:
        if self._ended is None:
            self._ended = asyncio.get_running_loop().create_future()
        return self._ended

    def job_ended(self, status: JobStatus) -> None:
        """Note how the job ended (the daemon, once the runner returned)."""
        ended = self._ended_future()
        if not ended.done():
            ended.set_result(status)

    async def wait_ended(self) -> JobStatus | None:
        """Return how the job ended; None if it is still stopping after the answer's wait."""
        try:
            async with asyncio.timeout(STOP_ANSWER_WAIT_SECONDS):
                return await asyncio.shield(self._ended_future())
        except TimeoutError:
            return None

    def answering(self, started: bool) -> None:
        """Count a stop's answer in (``started``) or out: the daemon waits for them."""
        self._answering += 1 if started else -1
        if self._answering == 0:
            self._answered.set()
        else:
            self._answered.clear()

    def outlive(self, pid: int) -> None:
        """Have the daemon wait for process ``pid`` to exit before it exits (see :mod:`.peers`)."""
        self._clients.add(pid)

    async def wait_clients(self, grace: float = CLIENT_EXIT_GRACE_SECONDS) -> None:
        """Let the stop answers go out, then outlive the clients that asked (within ``grace``)."""
        if self._answering:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._answered.wait(), grace)
        if self._clients:
            left = await outlive(self._clients, grace)
            if left:
                log.warning(
                    "clients %s that asked the job to stop are still running after %.0f s; "
                    "exiting (they end with it)",
                    left,
                    grace,
                )

    async def dispose(self, target: str) -> dict[str, Any]:
        """Remove the savepoint ``target`` (its path or id) and the copies it holds.

        See :mod:`.savepoint_disposal`; refused for one the job depends on.
        """
        async with self._lock:
            search = [self.default_dir]
            sp_id, path = find_savepoint(target, self._taken, search)
            reason = self._in_use(path)
            if reason is not None:
                raise SavepointDisposalError(
                    f"savepoint {sp_id} ({path}) is in use: {reason}; nothing was removed",
                    in_use=True,
                )
            freed = await asyncio.to_thread(dispose_directory, path)
            self._taken.pop(sp_id, None)
        log.info("savepoint %d at %s disposed of (%d bytes freed)", sp_id, path, freed)
        return {"id": sp_id, "path": str(path), "disposed": True, "bytes_freed": freed}

    def _in_use(self, path: Path) -> str | None:
        """Why the job needs the savepoint at ``path`` (None: it does not)."""
        run = self._runner.run_state
        coordinator = run.coordinator
        if coordinator is not None:
            for cid in coordinator.pending_ids:
                sp = coordinator.savepoint_dir(cid)
                if sp is not None and sp.resolve() == path:
                    return f"savepoint {cid} is still being taken there"
        restored_next = self._runner.restore_points.savepoint_restored_next()
        if restored_next is not None and restored_next.expanduser().resolve() == path:
            return (
                "the job would restore it after a failure (no checkpoint has completed "
                "since the job started from it or stopped with it); dispose of it once a "
                "checkpoint completed"
            )
        return None

    async def cancel(self) -> None:
        """Stop now; the newest checkpoint stays for a later resume."""
        self.stopping = True
        self._runner.cancel()

    # -- graceful stops (SIGTERM) ---------------------------------------------------

    async def graceful_stop(self, mode: ShutdownMode) -> None:
        """Stop the job the way ``shutdown.mode`` says; always ends in cancellation."""
        try:
            if mode is ShutdownMode.SAVEPOINT:
                await self.stop_with_savepoint()
                return
            async with self._lock:
                coordinator = self._coordinator()
                coordinator.suspend_triggers()
                self.stopping = True
                last = await self._finish_in_flight(coordinator)
                if mode is ShutdownMode.CHECKPOINT:
                    started = asyncio.get_running_loop().time()
                    # the final checkpoint commits all output
                    self._runner.run_state.request_roll()
                    completed = await coordinator.trigger()
                    last = completed.checkpoint_id
                    log.info(
                        "shutdown: final checkpoint %d completed in %.0f ms",
                        last,
                        (asyncio.get_running_loop().time() - started) * 1000,
                    )
                if last is not None:
                    await self._wait_committed(last)
        except JobNotRunningError:
            pass
        except Exception as exc:  # stopping must go on: the older checkpoints stay valid
            log.error("shutdown (%s): %s; cancelling", mode.value, exc)
        finally:
            self.stopping = True
            self._runner.cancel()

    async def _finish_in_flight(self, coordinator: CheckpointCoordinator) -> int | None:
        """Let checkpoints already triggered complete (or fail); the newest completed id."""
        pending = list(coordinator.pending_ids)
        if not pending:
            return None
        log.info("shutdown: waiting for checkpoint(s) %s in flight", pending)
        outcomes = await asyncio.wait_for(
            self._stats.wait_for_outcomes(pending), coordinator.config.timeout + 5
        )
        done = [cid for cid, status in outcomes.items() if status == "completed"]
        return max(done) if done else None

    async def _wait_committed(self, checkpoint_id: int) -> bool:
        """Give the tasks time to commit checkpoint ``checkpoint_id``'s output before cancelling.

        With worker processes the sinks are theirs: what counts is each worker's
        confirmation, not that the main process sent the notification. Returns
        whether every task confirmed it.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + COMMIT_WAIT_SECONDS
        run = self._runner.run_state
        while loop.time() < deadline:
            committed = run.last_committed()
            if committed is not None and committed >= checkpoint_id:
                return True
            await asyncio.sleep(0.01)
        log.warning("shutdown: sinks did not confirm checkpoint %d in time", checkpoint_id)
        return False
