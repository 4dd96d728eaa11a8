"""A task's figures as the REST API and ``/metrics`` show them, wherever the task runs.

The main process reads its own tasks' figures at scrape time; a worker
process reads its tasks' the same way and sends them to the main process
(``runtime.workers.worker_metrics``). Both use :class:`TaskSampler` for what needs a
time window (records per second, the backpressured share of samples, as
Flink's web UI shows them) and :func:`task_figures` for the row, so a
subtask looks the same in one process or in a worker.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiostream_ckpt.connectors.base import TransactionReporter
from aiostream_ckpt.jobspec.watermarks import MIN_WATERMARK
from aiostream_ckpt.runtime.chain import ChainSpec, TaskMetrics
from aiostream_ckpt.runtime.task import StreamTask


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


def operator_records(spec: ChainSpec, metrics: TaskMetrics) -> list[dict[str, Any]]:
    """Return each chained operator's records in and out (Flink's ``numRecordsIn/Out``).

    Only the outs are counted (per batch, ``runtime.operator_chain``): a chain
    hands operator ``i``'s output to operator ``i + 1`` whole, so its in is the
    previous one's out, the first one's the task's ``records_in``.
    """
    rows = []
    records_in = metrics.records_in
    for op in spec.operators:
        rows.append({"operator": op.uid, "records_in": records_in, "records_out": op.records_out})
        records_in = op.records_out
    return rows


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


def transactional_writers(
    tasks: Iterable[StreamTask],
) -> Iterator[tuple[StreamTask, TransactionReporter]]:
    """Sink writers that report their transactions (the Kafka exactly-once sink)."""
    for task in tasks:
        writer = task.spec.writer
        if isinstance(writer, TransactionReporter):
            yield task, writer


def transaction_rows(
    writers: Iterable[tuple[StreamTask, TransactionReporter]],
) -> Iterator[dict[str, Any]]:
    """Open and pre-committed sink transactions of ``writers``, per task, oldest first."""
    for task, writer in writers:
        for row in writer.transactions():
            yield {"task": task.task_id, "sink": task.spec.sink_uid, **row}


@dataclass
class _Samples:
    """Recent samples of one task: (monotonic, records in, records out, backpressured)."""

    task: StreamTask
    points: deque[tuple[float, int, int, bool]] = field(default_factory=deque)


class TaskSampler:
    """Samples tasks' counters so rates and backpressure cover the last ``window`` seconds.

    Each sample also has the transactional sinks check their transactions'
    ages. Which writers those are is found once per attempt (:meth:`watch`):
    ``isinstance`` against a runtime-checkable protocol costs ~20 us, and at
    ten samples a second per task that was a fifth of an idle daemon's CPU
    (parallelism 8: 1.25 % of a core, 1.02 % without it).
    """

    def __init__(self, monotonic: Callable[[], float], window: float = 5.0) -> None:
        self._monotonic = monotonic
        self.window = window
        self._samples: dict[str, _Samples] = {}
        #: the watched tasks' transactional sink writers
        self.writers: list[tuple[StreamTask, TransactionReporter]] = []

    def watch(self, tasks: Iterable[StreamTask]) -> None:
        """Sample ``tasks`` from now on (an attempt's), forgetting the earlier ones."""
        tasks = list(tasks)
        self._samples = {t.task_id: _Samples(t) for t in tasks}
        self.writers = list(transactional_writers(tasks))

    def sample(self) -> None:
        for _, writer in self.writers:
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


def task_figures(task: StreamTask, sampler: TaskSampler) -> dict[str, Any]:
    """One subtask's row: counters of this attempt, rates, queue fill, checkpoint figures.

    JSON-able throughout: a worker sends it to the main process as it is.
    """
    m, spec = task.metrics, task.spec
    rate_in, rate_out, bp = sampler.rates(task)
    fill_in = input_fill(task)
    watermark = task.watermark
    return {
        "task": task.task_id,
        "subtask": spec.subtask,
        "parallelism": spec.parallelism,
        "operators": chain_uids(task),
        "source": spec.reader is not None,
        "state": task.state.value,
        "records_in": m.records_in,
        "records_out": m.records_out,
        "records_in_per_second": round(rate_in, 1),
        "records_out_per_second": round(rate_out, 1),
        "operator_records": operator_records(spec, m),
        "input_queue_fill": None if fill_in is None else round(fill_in, 3),
        "output_queue_fill": round(output_fill(task), 3),
        "backpressure_ratio": round(bp, 3),
        "watermark": None if watermark <= MIN_WATERMARK else watermark,
        "last_checkpoint_acked": m.last_acked_checkpoint,
        "last_checkpoint_size_bytes": m.last_checkpoint_size_bytes,
        "last_checkpoint_sync_ms": round(m.last_checkpoint_sync_ms, 3),
        "last_alignment_ms": round(m.last_alignment_ms, 3),
        "source_lag": dict(source_lag(task)),
    }
