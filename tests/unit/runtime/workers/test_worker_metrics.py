"""The main process's view of its workers' reports: live figures, and what a gone worker shows."""

from __future__ import annotations

from typing import Any

from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.runtime.workers.heartbeats import HeartbeatMonitor
from aiostream_ckpt.runtime.workers.worker_metrics import WorkerReports


def row(task: str, *, source: bool, records: int, state: str = "running") -> dict[str, Any]:
    return {
        "task": task,
        "source": source,
        "state": state,
        "records_in": records,
        "records_out": records,
        "records_in_per_second": 100.0,
        "records_out_per_second": 100.0,
        "input_queue_fill": None if source else 0.5,
        "output_queue_fill": 0.25,
        "backpressure_ratio": 0.5,
        "source_lag": {"split-0": 7} if source else {},
    }


def report(worker: int, pid: int, *rows: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "metrics",
        "worker": worker,
        "pid": pid,
        "tasks": list(rows),
        "transactions": [],
        "transaction_ages": {},
    }


def two_workers() -> tuple[WorkerReports, ManualClock]:
    clock = ManualClock()
    reports = WorkerReports(2, clock.monotonic)
    reports.update(report(0, 10, row("events-0", source=True, records=30)))
    reports.update(
        report(
            1,
            11,
            row("events-1", source=True, records=12),
            row("pv-count-1", source=False, records=40, state="finished"),
        )
    )
    return reports, clock


def test_rows_carry_their_worker_and_the_sources_sum_over_workers() -> None:
    reports, clock = two_workers()
    clock.advance(0.25)
    rows = {r["task"]: r for r in reports.rows()}
    assert {t: (r["worker"], r["pid"], r["live"]) for t, r in rows.items()} == {
        "events-0": (0, 10, True),
        "events-1": (1, 11, True),
        "pv-count-1": (1, 11, True),
    }
    assert rows["events-1"]["source_lag"] == {"split-0": 7}
    assert reports.source_records() == 42
    assert reports.report_age(0) == 0.25


def test_a_failed_worker_shows_no_current_figures_and_ignores_late_reports() -> None:
    reports, _ = two_workers()
    reports.failed(1)
    reports.update(report(1, 11, row("events-1", source=True, records=99)))  # already in flight
    rows = {r["task"]: r for r in reports.rows()}
    gone = rows["events-1"]
    assert (gone["live"], gone["state"], gone["records_in"]) == (False, "failed", 12)
    assert gone["records_in_per_second"] == gone["backpressure_ratio"] == 0.0
    assert gone["source_lag"] == {} and gone["output_queue_fill"] == 0.0
    assert rows["pv-count-1"]["state"] == "finished"  # what had ended stays ended
    assert rows["events-0"]["live"]


def test_stopping_the_attempt_cancels_what_still_ran() -> None:
    reports, _ = two_workers()
    reports.stopped(0, failed=False)
    reports.stopped(1, failed=True)
    rows = {r["task"]: r for r in reports.rows()}
    assert rows["events-0"]["state"] == "canceled" and not rows["events-0"]["live"]
    assert rows["events-1"]["state"] == "failed"


def test_each_worker_process_with_when_it_was_last_heard() -> None:
    """REST ``/job``'s ``workers``: pid, status, heartbeat age and worst lag, report age."""
    clock = ManualClock()
    heartbeats = HeartbeatMonitor(2, 20.0, clock)
    reports = WorkerReports(2, clock.monotonic, heartbeats)
    reports.started(0, 41)
    reports.started(1, 42)
    heartbeats.heard(0, {"type": "heartbeat", "lag": 0.3})
    reports.update(report(0, 41, row("events-0", source=True, records=10)))
    clock.advance(2.0)
    heartbeats.heard(1, {"type": "heartbeat", "lag": 0.1})
    clock.advance(1.0)
    reports.failed(1)
    assert reports.processes() == [
        {
            "worker": 0,
            "pid": 41,
            "status": "running",
            "heartbeat_age_s": 3.0,
            "heartbeat_max_lag_s": 0.3,
            "report_age_s": 3.0,
        },
        {
            "worker": 1,
            "pid": 42,
            "status": "failed",
            "heartbeat_age_s": 1.0,
            "heartbeat_max_lag_s": 0.1,
            "report_age_s": None,
        },
    ]
    assert WorkerReports(1, clock.monotonic).heartbeat_age(0) is None  # none watched
