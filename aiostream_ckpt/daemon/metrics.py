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
the hot path never touches a Prometheus metric.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from aiostream_ckpt.connectors.base import TransactionReporter
from aiostream_ckpt.runtime.job import JobRun, JobStatus
from aiostream_ckpt.runtime.task import StreamTask

#: Flink's backpressure levels: ratio of backpressured samples.
_BP_LOW, _BP_HIGH = 0.10, 0.50


def backpressure_level(ratio: float) -> str:
    if ratio > _BP_HIGH:
        return "high"
    return "low" if ratio > _BP_LOW else "ok"


def output_fill(task: StreamTask) -> float:
    """Fullest downstream queue this task writes to (1.0: the next put suspends)."""
    fill = 0.0
    for gate in task.spec.outputs:
        for w in gate.writers:
            fill = max(fill, w.fill_ratio())
    return fill


def input_fill(task: StreamTask) -> float | None:
    gate = task.spec.input_gate
    return gate.fill_ratio() if gate is not None else None


def chain_uids(task: StreamTask) -> list[str]:
    spec = task.spec
    uids = [spec.head_uid] if spec.head_uid else []
    uids += [op.uid for op in spec.operators]
    if spec.sink_uid:
        uids.append(spec.sink_uid)
    return uids


def source_lag(task: StreamTask) -> Mapping[str, float]:
    """Per-split lag when the reader offers ``lag()`` (optional, see SourceReader)."""
    lag = getattr(task.spec.reader, "lag", None)
    if not callable(lag):
        return {}
    try:
        value = lag()
    except Exception:  # a broken lag probe must not break the scrape
        return {}
    return value if isinstance(value, Mapping) else {}


@dataclass
class _Samples:
    """Recent samples of one task: (monotonic, records in, records out, backpressured)."""

    task: StreamTask
    points: deque[tuple[float, int, int, bool]] = field(default_factory=deque)


class JobStats:
    """Checkpoint history and counters across attempts; throughput sampler."""

    def __init__(
        self,
        monotonic: Callable[[], float],
        *,
        window: float = 5.0,
        sample_every: float = 0.1,
        history_limit: int = 1000,
    ) -> None:
        self._monotonic = monotonic
        self.window = window
        self.sample_every = sample_every
        self.run: JobRun | None = None
        self.history: deque[dict[str, Any]] = deque(maxlen=history_limit)
        #: (kind, status) -> count, kind "checkpoint" | "savepoint", status "completed" | "aborted"
        self.counts: dict[tuple[str, str], int] = {}
        self._base_in: dict[str, int] = {}
        self._base_out: dict[str, int] = {}
        self._tasks: list[StreamTask] = []
        self._samples: dict[str, _Samples] = {}
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
        for t in self._tasks:
            self._base_in[t.task_id] = self._base_in.get(t.task_id, 0) + t.metrics.records_in
            self._base_out[t.task_id] = self._base_out.get(t.task_id, 0) + t.metrics.records_out
        self.run = run
        self._tasks = list(run.tasks)
        self._samples = {t.task_id: _Samples(t) for t in self._tasks}
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

    def totals(self, task: StreamTask) -> tuple[int, int]:
        m = task.metrics
        tid = task.task_id
        return self._base_in.get(tid, 0) + m.records_in, self._base_out.get(tid, 0) + m.records_out

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
        for _, writer in self._transactional_writers():
            writer.check_transaction_ages()
        now = self._monotonic()
        for s in self._samples.values():
            m = s.task.metrics
            s.points.append((now, m.records_in, m.records_out, output_fill(s.task) >= 1.0))
            while len(s.points) > 2 and now - s.points[0][0] > self.window:
                s.points.popleft()

    def rates(self, task: StreamTask) -> tuple[float, float, float]:
        """Return records in/s, records out/s and the backpressured share over the window."""
        s = self._samples.get(task.task_id)
        if s is None or s.task is not task or len(s.points) < 2:
            return 0.0, 0.0, 0.0
        t0, in0, out0, _ = s.points[0]
        t1, in1, out1, _ = s.points[-1]
        dt = t1 - t0
        if dt <= 0:
            return 0.0, 0.0, 0.0
        bp = sum(1 for p in s.points if p[3]) / len(s.points)
        return (in1 - in0) / dt, (out1 - out0) / dt, bp

    # -- views ----------------------------------------------------------------------

    def task_rows(self) -> Iterator[dict[str, Any]]:
        for task in self._tasks:
            rec_in, rec_out = self.totals(task)
            rate_in, rate_out, bp = self.rates(task)
            uids = chain_uids(task)
            fill_in = input_fill(task)
            yield {
                "task": task.task_id,
                "subtask": task.spec.subtask,
                "parallelism": task.spec.parallelism,
                "operators": uids,
                "state": task.state.value,
                "records_in": rec_in,
                "records_out": rec_out,
                "records_in_per_second": round(rate_in, 1),
                "records_out_per_second": round(rate_out, 1),
                "input_queue_fill": None if fill_in is None else round(fill_in, 3),
                "output_queue_fill": round(output_fill(task), 3),
                "backpressure_ratio": round(bp, 3),
                "backpressure": backpressure_level(bp),
                "last_checkpoint_sync_ms": round(task.metrics.last_checkpoint_sync_ms, 3),
                "last_alignment_ms": round(task.metrics.last_alignment_ms, 3),
                "source_lag": dict(source_lag(task)),
            }

    def _transactional_writers(self) -> Iterator[tuple[StreamTask, TransactionReporter]]:
        """Sink writers that report their transactions (the Kafka exactly-once sink)."""
        for task in self._tasks:
            writer = task.spec.writer
            if isinstance(writer, TransactionReporter):
                yield task, writer

    def transaction_rows(self) -> Iterator[dict[str, Any]]:
        """Open and pre-committed sink transactions, per task, oldest first."""
        for task, writer in self._transactional_writers():
            for row in writer.transactions():
                yield {"task": task.task_id, "sink": task.spec.sink_uid, **row}

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
        stats = self._stats
        labels = ["task", "operator", "subtask"]
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
            "aiostream_input_queue_fill_ratio", "Fill of the task's input queue.", labels=["task"]
        )
        fill_out = GaugeMetricFamily(
            "aiostream_output_queue_fill_ratio",
            "Fill of the fullest downstream queue the task writes to.",
            labels=["task"],
        )
        bp = GaugeMetricFamily(
            "aiostream_backpressure_ratio",
            "Share of recent samples in which a downstream queue was full.",
            labels=["task"],
        )
        lag = GaugeMetricFamily(
            "aiostream_source_lag",
            "How far a source split is behind its end (records; bytes for files).",
            labels=["task", "split"],
        )
        for task in stats._tasks:
            uids = chain_uids(task)
            sub = str(task.spec.subtask)
            n_in, n_out = stats.totals(task)
            rec_in.add_metric([task.task_id, uids[0], sub], float(n_in))
            rec_out.add_metric([task.task_id, uids[-1], sub], float(n_out))
            gate_fill = input_fill(task)
            if gate_fill is not None:
                fill_in.add_metric([task.task_id], gate_fill)
            fill_out.add_metric([task.task_id], output_fill(task))
            bp.add_metric([task.task_id], stats.rates(task)[2])
            for split, value in source_lag(task).items():
                lag.add_metric([task.task_id, str(split)], float(value))
        yield from (rec_in, rec_out, fill_in, fill_out, bp, lag)
        txn_age = GaugeMetricFamily(
            "aiostream_sink_oldest_transaction_age_seconds",
            "Age of the oldest open or pre-committed sink transaction (0: none); the broker "
            "aborts it at the sink's transaction timeout.",
            labels=["task"],
        )
        for task, writer in stats._transactional_writers():
            txn_age.add_metric([task.task_id], float(writer.oldest_transaction_age()))
        yield txn_age

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
        }
        for key, (name, doc, scale) in gauges.items():
            g = GaugeMetricFamily(name, doc)
            if last is not None:
                g.add_metric([], float(last[key]) * scale)
            yield g
