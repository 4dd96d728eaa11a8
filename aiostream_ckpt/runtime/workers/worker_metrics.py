"""Subtask figures across processes: workers report them, the main process serves them.

As Flink's TaskManagers report their metrics to the JobManager, each worker
(``job.workers`` > 1) sends its subtasks' figures (``runtime.task_report``)
to the main process over the control connection: every
:data:`REPORT_EVERY` seconds, soon after a checkpoint acknowledgement (at
most every :data:`SAMPLE_EVERY`), and once more when its tasks ended -- never
per record. The main process keeps each worker's latest report
(:class:`WorkerReports`) for the REST API, ``/metrics`` and the progress line.

A report is only as fresh as its worker: once a worker died (or was stopped
with the attempt) its subtasks say so -- ``live`` false, state ``failed``
(or ``canceled``), no rates or queue fills -- rather than showing the last
figures as if they were current, until the next attempt's workers report.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiostream_ckpt.errors import ChannelError
from aiostream_ckpt.runtime.network.remote import ChannelConnection
from aiostream_ckpt.runtime.task import StreamTask
from aiostream_ckpt.runtime.task_report import (
    TaskSampler,
    task_figures,
    transaction_rows,
)
from aiostream_ckpt.runtime.workers.heartbeats import HeartbeatMonitor

#: seconds between a worker's reports, and between its samples (rates, backpressure)
REPORT_EVERY = 0.5
SAMPLE_EVERY = 0.1

#: a row's figures that describe the present: zeroed once its worker is gone
_LIVE_FIGURES: dict[str, Any] = {
    "records_in_per_second": 0.0,
    "records_out_per_second": 0.0,
    "input_queue_fill": None,
    "output_queue_fill": 0.0,
    "backpressure_ratio": 0.0,
    "source_lag": {},
}


class MetricsReporter:
    """A worker's side: samples its tasks and sends their figures to the main process."""

    def __init__(
        self,
        control: ChannelConnection,
        index: int,
        tasks: Sequence[StreamTask],
        monotonic: Callable[[], float],
    ) -> None:
        self._control = control
        self._index = index
        self._tasks = list(tasks)
        self._monotonic = monotonic
        self._sampler = TaskSampler(monotonic)
        self._sampler.watch(self._tasks)
        self._last = -REPORT_EVERY
        self._soon = False

    def report(self) -> None:
        """Send the figures now (before ``done`` or ``failed``: the final ones)."""
        self._soon = False
        self._last = self._monotonic()
        writers = self._sampler.writers
        ages = {t.task_id: w.oldest_transaction_age() for t, w in writers}
        self._control.send_message(
            {
                "type": "metrics",
                "worker": self._index,
                "pid": os.getpid(),
                "tasks": [task_figures(t, self._sampler) for t in self._tasks],
                "transactions": list(transaction_rows(writers)),
                "transaction_ages": ages,
            }
        )

    def report_soon(self) -> None:
        """After an ack: one report for every task that acks in this turn, none too close."""
        if not self._soon and self._monotonic() - self._last >= SAMPLE_EVERY:
            self._soon = True
            asyncio.get_running_loop().call_soon(self._report_if_soon)

    def _report_if_soon(self) -> None:
        if self._soon and not self._control.failure.done():
            # closed by the main process (a failover's stop): nobody reads them
            with contextlib.suppress(ChannelError):
                self.report()

    async def run(self) -> None:
        """Sample every :data:`SAMPLE_EVERY`, report every :data:`REPORT_EVERY`; until cancelled."""
        while True:
            self._sampler.sample()
            if self._monotonic() - self._last >= REPORT_EVERY:
                self.report()
            await asyncio.sleep(SAMPLE_EVERY)


@dataclass
class WorkerReport:
    """The latest figures of one worker's subtasks, as the main process holds them."""

    index: int
    pid: int | None = None
    #: "running" while reports may come, "failed" once it died, "stopped" with the attempt
    status: str = "running"
    received: float | None = None
    tasks: list[dict[str, Any]] = field(default_factory=list)
    transactions: list[dict[str, Any]] = field(default_factory=list)
    transaction_ages: dict[str, float] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return self.status == "running"


class WorkerReports:
    """The main process's side: every worker's latest report, for REST, metrics, progress."""

    def __init__(
        self,
        workers: int,
        monotonic: Callable[[], float],
        heartbeats: HeartbeatMonitor | None = None,
    ) -> None:
        self._monotonic = monotonic
        self._heartbeats = heartbeats
        self.workers = [WorkerReport(i) for i in range(workers)]

    def started(self, index: int, pid: int | None) -> None:
        self.workers[index].pid = pid

    def update(self, message: dict[str, Any]) -> None:
        """Take a worker's ``metrics`` message (ignored once it is no longer live)."""
        w = self.workers[int(message["worker"])]
        if not w.live:
            return
        w.pid = message["pid"]
        w.received = self._monotonic()
        w.tasks = message["tasks"]
        w.transactions = message["transactions"]
        w.transaction_ages = message["transaction_ages"]

    def failed(self, index: int) -> None:
        """Mark a worker that died or reported a failure: its subtasks run no more."""
        self.stopped(index, failed=True)

    def stopped(self, index: int, *, failed: bool) -> None:
        """Mark a worker the attempt stopped (``failed``: it had died or failed first)."""
        w = self.workers[index]
        if w.live:
            w.status = "failed" if failed else "stopped"

    def report_age(self, index: int) -> float | None:
        """Seconds since the worker's latest report (None: none yet)."""
        received = self.workers[index].received
        return None if received is None else self._monotonic() - received

    def heartbeat_age(self, index: int) -> float | None:
        """Seconds since the worker was last heard (None: never, or not watched)."""
        return None if self._heartbeats is None else self._heartbeats.age(index)

    def processes(self) -> list[dict[str, Any]]:
        """Each worker process: pid, status, when last heard, its loop's worst heartbeat lag."""
        hb = self._heartbeats
        return [
            {
                "worker": w.index,
                "pid": w.pid,
                "status": w.status,
                "heartbeat_age_s": self.heartbeat_age(w.index),
                "heartbeat_max_lag_s": None if hb is None else hb.max_lag(w.index),
                "report_age_s": self.report_age(w.index),
            }
            for w in self.workers
        ]

    def rows(self) -> Iterator[dict[str, Any]]:
        """Every reported subtask with its worker; a gone worker's without current figures."""
        for w in self.workers:
            for row in w.tasks:
                out = {**row, "worker": w.index, "pid": w.pid, "live": w.live}
                if not w.live:
                    out.update(_LIVE_FIGURES)
                    if row["state"] not in ("finished", "failed"):
                        out["state"] = "failed" if w.status == "failed" else "canceled"
                yield out

    def source_records(self) -> int:
        """Count the records the workers' sources read, as of their latest reports."""
        return sum(r["records_in"] for w in self.workers for r in w.tasks if r["source"])

    def transaction_rows(self) -> Iterator[dict[str, Any]]:
        for w in self.workers:
            if w.live:
                for row in w.transactions:
                    yield {**row, "worker": w.index}

    def transaction_ages(self) -> Iterator[tuple[str, int, float]]:
        """(task, worker, oldest open transaction's age as last reported) of live workers."""
        for w in self.workers:
            if w.live:
                for task, age in w.transaction_ages.items():
                    yield task, w.index, age
