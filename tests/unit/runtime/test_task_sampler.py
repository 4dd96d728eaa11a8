"""The metrics sampler's cost per sample does not include finding the transactional sinks.

It samples ten times a second in the main process and in every worker, busy
or idle. Telling a transactional sink from another writer is an
``isinstance`` against a runtime-checkable protocol (~20 us); done per task
at every sample it was a fifth of an idle daemon's CPU (parallelism 8).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.daemon.metrics import JobStats
from aiostream_ckpt.runtime.task_report import TaskSampler


class PlainWriter:
    """A writer without transactions; counts the attributes looked up on it in vain."""

    def __init__(self) -> None:
        self.probes = 0

    def __getattr__(self, name: str) -> Any:
        self.probes += 1  # isinstance(w, TransactionReporter) asks for `transactions`
        raise AttributeError(name)


class TxnWriter:
    """A transactional writer: counts its age checks."""

    def __init__(self) -> None:
        self.checks = 0

    def transactions(self) -> list[dict[str, Any]]:
        return [{"transactional_id": "t-0", "state": "open"}]

    def oldest_transaction_age(self) -> float:
        return 1.5

    def check_transaction_ages(self) -> None:
        self.checks += 1


def task(task_id: str, writer: Any) -> Any:
    return SimpleNamespace(
        task_id=task_id,
        spec=SimpleNamespace(writer=writer, outputs=[], sink_uid="sink"),
        metrics=SimpleNamespace(records_in=0, records_out=0),
    )


def test_sampling_checks_the_writers_kinds_once_per_attempt() -> None:
    plain, txn = PlainWriter(), TxnWriter()
    sampler = TaskSampler(ManualClock().monotonic)
    sampler.watch([task("a-0", plain), task("b-0", txn)])
    probes = plain.probes
    for _ in range(100):
        sampler.sample()
    assert plain.probes == probes  # old code: one more probe per sample
    assert txn.checks == 100  # the sink still checks its transactions' ages every sample
    assert [t.task_id for t, _ in sampler.writers] == ["b-0"]


def test_job_stats_sample_and_transaction_views_use_the_attempts_writers() -> None:
    plain, txn = PlainWriter(), TxnWriter()
    stats = JobStats(ManualClock().monotonic)
    run = SimpleNamespace(tasks=[task("a-0", plain), task("b-0", txn)], workers=None)
    run.coordinator = None
    stats.attach(run)  # type: ignore[arg-type]
    probes = plain.probes
    for _ in range(100):
        stats.sample()
    assert list(stats.transaction_rows()) == [
        {"task": "b-0", "sink": "sink", "transactional_id": "t-0", "state": "open"}
    ]
    assert list(stats.transaction_ages()) == [("b-0", None, 1.5)]
    assert plain.probes == probes
    assert txn.checks == 100
