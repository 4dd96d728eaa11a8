"""``aiostream-ckpt run`` as a long-running daemon: the job, its REST API, SIGTERM.

The job runner knows nothing of HTTP or signals; this service puts the pieces
around it: job-level statistics attached to every attempt, the savepoint
service, the REST server, and the graceful stop chosen by ``shutdown.mode``
(a second signal cancels at once).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST

from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.clock import Clock, SystemClock
from aiostream_ckpt.daemon import address
from aiostream_ckpt.daemon.metrics import JobStats
from aiostream_ckpt.daemon.savepoints import SavepointService
from aiostream_ckpt.daemon.settings import DaemonSettings
from aiostream_ckpt.daemon.vertices import vertex_rows
from aiostream_ckpt.jobspec.graph import JobSpec
from aiostream_ckpt.runtime.job import JobResult, JobRunner, JobStatus
from aiostream_ckpt.runtime.workers.worker_process import EarlyWorkers, WorkerLaunch

if TYPE_CHECKING:
    from aiostream_ckpt.daemon.rest import RestServer

log = logging.getLogger(__name__)


class JobDaemon:
    """Runs one job spec with REST control; implements :class:`~.rest.JobControl`."""

    def __init__(
        self,
        spec: JobSpec,
        settings: DaemonSettings | None = None,
        *,
        clock: Clock | None = None,
        launch: WorkerLaunch | None = None,
        early: EarlyWorkers | None = None,
    ) -> None:
        self.settings = settings or DaemonSettings()
        clock = clock or SystemClock()
        self.stats = JobStats(clock.monotonic)
        self.runner = JobRunner(
            spec,
            clock=clock,
            on_started=self.stats.attach,
            process=self.settings.process_profile(),
            launch=launch,
            early=early,
        )
        ckpt_dir = self.runner.config.checkpoint_dir()
        assert ckpt_dir is not None  # JobRunner refuses a job without one
        self.savepoints = SavepointService(
            self.runner, self.stats, self.settings.savepoint_dir or ckpt_dir / "savepoints"
        )
        s = self.settings
        self.rest: RestServer | None = None
        if s.rest_enabled:
            # here, not at the top: aiohttp takes ~0.4 s of CPU to import, which a job
            # without REST (rest.enabled=false) need not pay on each start
            from aiostream_ckpt.daemon.rest import RestServer

            self.rest = RestServer(
                self,
                bind=s.rest_bind,
                port=s.rest_port,
                token=s.rest_token,
                read_token=s.rest_read_token,
            )
        self._shutdown: asyncio.Task[None] | None = None
        self.address_file = self.settings.address_file or ckpt_dir / address.ADDRESS_FILE

    # -- lifecycle ------------------------------------------------------------------

    async def run(self) -> JobResult:
        """Serve the REST API while the job runs; stop serving when it ends.

        The address file says where to reach it (see :mod:`.address`) from the
        moment it listens until it stops. The job's directories are locked
        first: a second daemon on them is refused before it binds a port, writes
        an address file or touches anything else.
        """
        with self.runner.locks:
            return await self._serve()

    async def _serve(self) -> JobResult:
        async with self.stats:
            if self.rest is not None:
                await self.rest.start()
            pid = os.getpid()
            try:
                address.publish(
                    self.address_file,
                    address.DaemonAddress(
                        pid=pid,
                        rest_enabled=self.rest is not None,
                        host=self.settings.rest_bind if self.rest is not None else None,
                        port=self.rest.port if self.rest is not None else None,
                    ),
                )
                return await self.runner.run()
            finally:
                # a stop-with-savepoint's answer says how the job ended: let it go out,
                # and outlive the client that asked when this process is PID 1
                self.savepoints.job_ended(self.runner.run_state.status)
                await self.savepoints.wait_clients()
                address.withdraw(self.address_file, pid)
                if self._shutdown is not None:
                    self._shutdown.cancel()
                    await asyncio.gather(self._shutdown, return_exceptions=True)
                if self.rest is not None:
                    await self.rest.stop()

    def request_shutdown(self) -> None:
        """Signal handler: the first signal stops gracefully, the next one at once."""
        if self._shutdown is None:
            mode = self.settings.shutdown_mode
            log.info("stop requested by signal (shutdown.mode=%s)", mode.value)
            self._shutdown = asyncio.create_task(
                self.savepoints.graceful_stop(mode), name="graceful-stop"
            )
        else:
            log.warning("second stop signal: cancelling now")
            self.runner.cancel()

    # -- JobControl -----------------------------------------------------------------

    def health(self) -> tuple[bool, dict[str, Any]]:
        status = self.runner.run_state.status
        ok = status is not JobStatus.FAILED
        return ok, {"status": "ok" if ok else "failing", "job": status.value}

    def job_view(self) -> dict[str, Any]:
        run = self.runner.run_state
        config = self.runner.config
        final = self.savepoints.final_savepoint
        return {
            "name": self.runner.spec.job_name,
            "status": run.status.value,
            "attempt": run.attempt,
            "restarts": run.restarts,
            "last_checkpoint": run.last_checkpoint(),
            "stopping": self.savepoints.stopping,
            "savepoint": final.to_json() if final is not None else None,
            "workers": self.stats.workers.processes() if self.stats.workers is not None else [],
            "config": {
                "parallelism": config.parallelism,
                "max_parallelism": config.max_parallelism,
                "shard": str(config.shard) if config.shard.sharded else None,
                "checkpoint_interval_s": config.checkpoint.interval,
                "checkpointing_mode": config.checkpoint.mode.value,
                "restored_from": str(config.restore_from) if config.restore_from else None,
                "kafka": config.kafka.describe(),  # never the password
            },
            "graph": {
                "operators": [
                    {
                        "uid": t.uid,
                        "name": t.name,
                        "kind": t.kind.value,
                        "parallelism": t.parallelism,
                        "inputs": [i.uid for i in t.inputs],
                        "partitioning": t.partitioning.value,
                    }
                    for t in self.runner.spec.transformations
                ],
                "tasks": [
                    {
                        "id": row["task"],
                        "subtask": row["subtask"],
                        "parallelism": row["parallelism"],
                        "operators": row["operators"],
                        "state": row["state"],
                        "worker": row["worker"],
                        "pid": row["pid"],
                        "live": row["live"],
                    }
                    for row in self.stats.task_rows()
                ],
            },
        }

    def operators_view(self) -> dict[str, Any]:
        tasks = list(self.stats.task_rows())
        return {"window_seconds": self.stats.window, "vertices": vertex_rows(tasks), "tasks": tasks}

    def transactions_view(self) -> dict[str, Any]:
        return {"transactions": list(self.stats.transaction_rows())}

    def checkpoints_view(self) -> dict[str, Any]:
        coordinator = self.runner.run_state.coordinator
        counts = {
            ("" if kind == "checkpoint" else "savepoints_") + status: n
            for (kind, status), n in sorted(self.stats.counts.items())
        }
        return {
            "counts": counts,
            "in_progress": list(coordinator.pending_ids) if coordinator is not None else [],
            "history": list(reversed(self.stats.history)),
        }

    def latest_checkpoint_view(self) -> dict[str, Any] | None:
        coordinator = self.runner.run_state.coordinator
        chk: CompletedCheckpoint | None = None
        if coordinator is not None:
            chk = coordinator.latest_completed
        if chk is None:
            chk = self.runner.storage.latest_valid()
        if chk is None:
            return None
        return {
            "id": chk.checkpoint_id,
            "path": str(chk.directory),
            "final": chk.is_final,
            "trigger_time": chk.trigger_time,
            "completion_time": chk.completion_time,
            "duration_ms": round(chk.duration_seconds * 1000, 3),
            "size_bytes": chk.size_bytes,
            "tasks": chk.tasks,
            "operator_parallelism": {uid: op["parallelism"] for uid, op in chk.operators.items()},
        }

    def metrics(self) -> tuple[bytes, str]:
        return self.stats.render(), CONTENT_TYPE_LATEST
