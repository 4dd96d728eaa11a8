"""Job-level statistics for the REST API and Prometheus ``/metrics``.

Tasks and the coordinator are rebuilt on every attempt, so their counters
restart at zero and the coordinator's history is per attempt. :class:`JobStats`
is attached to each attempt (``JobRunner(on_started=...)``) and keeps what must
outlive one: record totals of earlier attempts, the checkpoint history and
failure counts. A sampler measures throughput and backpressure the way Flink's
web UI shows them: records per second over the last seconds, and the share of
samples in which a task could not hand its output on because a downstream
queue was full.

Values are read at scrape time from the live objects (a custom collector), so
the hot path never touches a Prometheus metric. Subtasks in worker processes
(``job.workers`` > 1) are read from their workers' latest reports
(``runtime.workers.worker_metrics``) and carry a ``worker`` label.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from aiostream_ckpt.daemon.vertices import (
    backpressure_level,
    operator_families,
    vertex_families,
    worker_name,
)
from aiostream_ckpt.runtime.job import JobRun, JobStatus
from aiostream_ckpt.runtime.task import StreamTask
from aiostream_ckpt.runtime.task_report import (
    TaskSampler,
    task_figures,
    transaction_rows,
)
from aiostream_ckpt.runtime.workers.worker_metrics import WorkerReports


class JobStats:
    """Checkpoint history and counters across attempts; throughput sampler."""

    def __init__(
        self,
        monotonic: Callable[[], float],
        *,
        window: float = 5.0,
        sample_every: float = 0.1,
        history_limit: int = 100,
    ) -> None:
        """``history_limit``: the newest entries kept for ``/checkpoints`` (Flink keeps 10).

        A full history is a fixed cost; 1000 entries (~465 bytes each) took
        17 minutes of 1 s checkpoints to fill, RSS rising all the while.
        """
        self.window = window
        self.sample_every = sample_every
        self.run: JobRun | None = None
        self.history: deque[dict[str, Any]] = deque(maxlen=history_limit)
        #: (kind, status) -> count, kind "checkpoint" | "savepoint", status "completed" | "aborted"
        self.counts: dict[tuple[str, str], int] = {}
        self._base_in: dict[str, int] = {}
        self._base_out: dict[str, int] = {}
        #: (task, chained operator) -> [records in, records out] of earlier attempts
        self._base_ops: dict[tuple[str, str], list[int]] = {}
        self._tasks: list[StreamTask] = []
        #: the attempt's subtasks in worker processes, as they reported them
        self._workers: WorkerReports | None = None
        self._rates = TaskSampler(monotonic, window)
        self._changed = asyncio.Event()
        self._sampler: asyncio.Task[None] | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self.checkpoint_duration = Histogram(
            "aiostream_checkpoint_duration_seconds",
            "End-to-end duration of completed checkpoints (trigger to durable metadata).",
            ["kind"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=self.registry,
        )

    # -- attaching to attempts ------------------------------------------------------

    def attach(self, run: JobRun) -> None:
        """Fold the finished attempt's totals in and listen to the new one (``on_started``)."""
        for row in self._attempt_rows():
            tid = row["task"]
            self._base_in[tid] = self._base_in.get(tid, 0) + row["records_in"]
            self._base_out[tid] = self._base_out.get(tid, 0) + row["records_out"]
            for r in row["operator_records"]:
                base = self._base_ops.setdefault((tid, r["operator"]), [0, 0])
                base[0] += r["records_in"]
                base[1] += r["records_out"]
        self.run = run
        self._tasks = list(run.tasks)
        self._workers = run.workers
        self._rates.watch(self._tasks)
        if run.coordinator is not None:
            run.coordinator.on_history = self.on_history

    def on_history(self, entry: dict[str, Any]) -> None:
        self.history.append(entry)  # the coordinator keeps no reference: no copy needed
        kind = "savepoint" if entry.get("savepoint") else "checkpoint"
        status = str(entry.get("status"))
        self.counts[(kind, status)] = self.counts.get((kind, status), 0) + 1
        if status == "completed":
            self.checkpoint_duration.labels(kind).observe(float(entry["duration_ms"]) / 1000)
        self._changed.set()

    async def wait_for_outcomes(self, ids: Iterable[int]) -> dict[int, str]:
        """Wait until every checkpoint in ``ids`` completed or was aborted; id -> status."""
        want = set(ids)
        while True:
            seen = {int(e["id"]): str(e["status"]) for e in self.history if int(e["id"]) in want}
            if len(seen) == len(want):
                return seen
            self._changed.clear()
            await self._changed.wait()

    # -- sampling -------------------------------------------------------------------

    async def start(self) -> None:
        if self._sampler is None:
            self._sampler = asyncio.create_task(self._run_sampler(), name="metrics-sampler")

    async def stop(self) -> None:
        task, self._sampler = self._sampler, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> JobStats:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _run_sampler(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.sample_every)

    def sample(self) -> None:
        """Sample rates and backpressure; the sinks check their transactions' ages."""
        self._rates.sample()

    def rates(self, task: StreamTask) -> tuple[float, float, float]:
        """Return records in/s, records out/s and the backpressured share over the window."""
        return self._rates.rates(task)

    # -- views ----------------------------------------------------------------------

    def _attempt_rows(self) -> Iterator[dict[str, Any]]:
        """Yield this attempt's subtasks (counts since its start): this process's, the workers'."""
        pid = os.getpid()
        for task in self._tasks:
            yield {**task_figures(task, self._rates), "worker": None, "pid": pid, "live": True}
        if self._workers is not None:
            yield from self._workers.rows()

    def task_rows(self) -> Iterator[dict[str, Any]]:
        """Every subtask with its worker (None: this process); records count every attempt."""
        for row in self._attempt_rows():
            tid = row["task"]
            row["records_in"] += self._base_in.get(tid, 0)
            row["records_out"] += self._base_out.get(tid, 0)
            row["operator_records"] = [self._with_base(tid, r) for r in row["operator_records"]]
            row["backpressure"] = backpressure_level(row["backpressure_ratio"])
            yield row

    def _with_base(self, tid: str, r: dict[str, Any]) -> dict[str, Any]:
        """Return a chained operator's records of this attempt plus the earlier attempts'."""
        base = self._base_ops.get((tid, r["operator"]))
        if base is None:
            return dict(r)
        return {
            **r,
            "records_in": r["records_in"] + base[0],
            "records_out": r["records_out"] + base[1],
        }

    def transaction_rows(self) -> Iterator[dict[str, Any]]:
        """Open and pre-committed sink transactions, per task, oldest first."""
        yield from transaction_rows(self._rates.writers)
        if self._workers is not None:
            yield from self._workers.transaction_rows()

    @property
    def workers(self) -> WorkerReports | None:
        """The current attempt's worker reports (``job.workers`` > 1), else None."""
        return self._workers

    def transaction_ages(self) -> Iterator[tuple[str, int | None, float]]:
        """(task, worker, age of its oldest open transaction) of every transactional sink."""
        for task, writer in self._rates.writers:
            yield task.task_id, None, writer.oldest_transaction_age()
        if self._workers is not None:
            yield from self._workers.transaction_ages()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Collector:
    """Builds the metric families from live state at scrape time."""

    def __init__(self, stats: JobStats) -> None:
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        stats = self._stats
        run = stats.run
        status = GaugeMetricFamily(
            "aiostream_job_status", "1 for the job's current status.", labels=["status"]
        )
        for s in JobStatus:
            current = run is not None and run.status is s
            status.add_metric([s.value], 1.0 if current else 0.0)
        yield status
        restarts = CounterMetricFamily("aiostream_job_restarts", "Restarts after failures.")
        restarts.add_metric([], float(run.restarts if run else 0))
        yield restarts
        attempt = GaugeMetricFamily("aiostream_job_attempt", "Current attempt (0 = first run).")
        attempt.add_metric([], float(run.attempt if run else 0))
        yield attempt
        yield from self._task_families()
        yield from self._checkpoint_families()

    def _task_families(self) -> Iterable[Metric]:
        """Per subtask; a subtask in a worker process also carries the ``worker`` label.

        A worker that is gone keeps its counters (as last reported) but no gauge:
        its queues and backpressure are not known any more.
        """
        stats = self._stats
        per_worker = stats.workers is not None
        extra = ["worker"] if per_worker else []
        labels = ["task", "operator", "subtask", *extra]
        rec_in = CounterMetricFamily(
            "aiostream_records_in",
            "Records into a task (its chain's first operator).",
            labels=labels,
        )
        rec_out = CounterMetricFamily(
            "aiostream_records_out",
            "Records out of a task (its chain's last operator).",
            labels=labels,
        )
        fill_in = GaugeMetricFamily(
            "aiostream_input_queue_fill_ratio",
            "Fill of the task's input queue.",
            labels=["task", *extra],
        )
        fill_out = GaugeMetricFamily(
            "aiostream_output_queue_fill_ratio",
            "Fill of the fullest downstream queue the task writes to.",
            labels=["task", *extra],
        )
        bp = GaugeMetricFamily(
            "aiostream_backpressure_ratio",
            "Share of recent samples in which a downstream queue was full.",
            labels=["task", *extra],
        )
        lag = GaugeMetricFamily(
            "aiostream_source_lag",
            "How far a source split is behind its end (records; bytes for files).",
            labels=["task", "split", *extra],
        )
        rows = list(stats.task_rows())
        for row in rows:
            tid, uids, sub = row["task"], row["operators"], str(row["subtask"])
            w = [worker_name(row["worker"])] if per_worker else []
            rec_in.add_metric([tid, uids[0], sub, *w], float(row["records_in"]))
            rec_out.add_metric([tid, uids[-1], sub, *w], float(row["records_out"]))
            if not row["live"]:
                continue
            if row["input_queue_fill"] is not None:
                fill_in.add_metric([tid, *w], row["input_queue_fill"])
            fill_out.add_metric([tid, *w], row["output_queue_fill"])
            bp.add_metric([tid, *w], row["backpressure_ratio"])
            for split, value in row["source_lag"].items():
                lag.add_metric([tid, str(split), *w], float(value))
        yield from (rec_in, rec_out, fill_in, fill_out, bp, lag)
        yield from vertex_families(rows)
        yield from operator_families(rows, per_worker)
        txn_age = GaugeMetricFamily(
            "aiostream_sink_oldest_transaction_age_seconds",
            "Age of the oldest open or pre-committed sink transaction (0: none); the broker "
            "aborts it at the sink's transaction timeout.",
            labels=["task", *extra],
        )
        for tid, worker, age in stats.transaction_ages():
            txn_age.add_metric([tid, *([worker_name(worker)] if per_worker else [])], age)
        yield txn_age
        if stats.workers is not None:
            yield from _worker_families(stats.workers)

    def _checkpoint_families(self) -> Iterable[Metric]:
        stats = self._stats
        counts = CounterMetricFamily(
            "aiostream_checkpoints",
            "Checkpoints and savepoints by outcome (aborted = failed, expired or subsumed).",
            labels=["kind", "status"],
        )
        for kind in ("checkpoint", "savepoint"):
            for status in ("completed", "aborted"):
                counts.add_metric([kind, status], float(stats.counts.get((kind, status), 0)))
        yield counts
        last = next(
            (
                e
                for e in reversed(stats.history)
                if e["status"] == "completed" and not e.get("savepoint")
            ),
            None,
        )
        gauges = {
            "id": ("aiostream_last_checkpoint_id", "Id of the newest completed checkpoint.", 1.0),
            "size_bytes": (
                "aiostream_last_checkpoint_size_bytes",
                "State size of the newest completed checkpoint.",
                1.0,
            ),
            "duration_ms": (
                "aiostream_last_checkpoint_duration_seconds",
                "Duration of the newest completed checkpoint.",
                0.001,
            ),
            "sync_ms_max": (
                "aiostream_last_checkpoint_sync_seconds",
                "Longest synchronous part over the tasks, newest completed checkpoint.",
                0.001,
            ),
            "async_ms_max": (
                "aiostream_last_checkpoint_async_seconds",
                "Longest asynchronous part over the tasks, newest completed checkpoint.",
                0.001,
            ),
            "alignment_ms_max": (
                "aiostream_last_checkpoint_alignment_seconds",
                "Longest barrier alignment over the tasks, newest completed checkpoint.",
                0.001,
            ),
            "unaligned": (
                "aiostream_last_checkpoint_unaligned",
                "1 when some task took the newest completed checkpoint unaligned.",
                1.0,
            ),
            "in_flight_bytes": (
                "aiostream_last_checkpoint_in_flight_bytes",
                "In-flight records' bytes the newest completed checkpoint persisted (unaligned).",
                1.0,
            ),
        }
        for key, (name, doc, scale) in gauges.items():
            g = GaugeMetricFamily(name, doc)
            if last is not None:
                g.add_metric([], float(last[key]) * scale)
            yield g


def _worker_families(reports: WorkerReports) -> Iterable[Metric]:
    """Whether each worker process serves its subtasks, how old its figures are, when heard."""
    up = GaugeMetricFamily(
        "aiostream_worker_up",
        "1 while the worker process runs its subtasks and reports; 0 once it died or stopped.",
        labels=["worker"],
    )
    age = GaugeMetricFamily(
        "aiostream_worker_report_age_seconds",
        "Seconds since the worker's latest report of its subtasks' figures.",
        labels=["worker"],
    )
    heard = GaugeMetricFamily(
        "aiostream_worker_heartbeat_age_seconds",
        "Seconds since the main process last heard from the worker (its heartbeats, any "
        "message); a running worker unheard for job.heartbeat_timeout is killed.",
        labels=["worker"],
    )
    for w in reports.workers:
        up.add_metric([str(w.index)], 1.0 if w.live else 0.0)
        seconds = reports.report_age(w.index)
        if seconds is not None:
            age.add_metric([str(w.index)], seconds)
        seconds = reports.heartbeat_age(w.index)
        if seconds is not None and w.live:
            heard.add_metric([str(w.index)], seconds)
    yield from (up, age, heard)
