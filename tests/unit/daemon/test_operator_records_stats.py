"""Chained operators' records across attempts and in ``/metrics`` (Flink's operator scope).

Tasks are rebuilt on every attempt, their counters from zero: as the
vertex-level records, each operator's count of earlier attempts is folded in
at the restart, so a restart does not reset what ``/operators`` and the
``aiostream_operator_records_*`` series show.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.daemon.metrics import JobStats
from aiostream_ckpt.daemon.vertices import vertex_rows
from aiostream_ckpt.runtime.job import JobStatus
from aiostream_ckpt.runtime.workers.worker_metrics import WorkerReports


def figures(subtask: int, records_in: int, ops: dict[str, int]) -> dict[str, Any]:
    """A worker's row of subtask ``steps-<subtask>``; ``ops``: each operator's records out."""
    chained, into = [], records_in
    for uid, out in ops.items():
        chained.append({"operator": uid, "records_in": into, "records_out": out})
        into = out
    return {
        "task": f"steps-{subtask}",
        "subtask": subtask,
        "parallelism": 2,
        "operators": ["steps", *ops, "sink"],
        "source": True,
        "state": "running",
        "records_in": records_in,
        "records_out": into,
        "records_in_per_second": 0.0,
        "records_out_per_second": 0.0,
        "operator_records": chained,
        "input_queue_fill": None,
        "output_queue_fill": 0.0,
        "backpressure_ratio": 0.0,
        "source_lag": {},
    }


def attempt(stats: JobStats, *rows: dict[str, Any]) -> None:
    """Attach an attempt whose one worker reported ``rows``."""
    reports = WorkerReports(1, ManualClock().monotonic)
    reports.update(
        {"worker": 0, "pid": 1, "tasks": list(rows), "transactions": [], "transaction_ages": {}}
    )
    run = SimpleNamespace(
        tasks=[], workers=reports, coordinator=None, status=JobStatus.RUNNING, restarts=0, attempt=0
    )
    stats.attach(run)  # type: ignore[arg-type]


def test_operator_records_add_up_over_attempts_and_subtasks() -> None:
    stats = JobStats(ManualClock().monotonic)
    attempt(stats, figures(0, 10, {"keep": 4, "twice": 8}), figures(1, 6, {"keep": 2, "twice": 4}))
    attempt(stats, figures(0, 5, {"keep": 1, "twice": 2}), figures(1, 0, {"keep": 0, "twice": 0}))
    rows = list(stats.task_rows())
    assert rows[0]["operator_records"] == [
        {"operator": "keep", "records_in": 15, "records_out": 5},
        {"operator": "twice", "records_in": 5, "records_out": 10},
    ]
    assert (rows[0]["records_in"], rows[0]["records_out"]) == (15, 10)  # as the vertex's ends
    (vertex,) = vertex_rows(rows)
    assert vertex["operator_records"] == [
        {"operator": "keep", "records_in": 21, "records_out": 7},
        {"operator": "twice", "records_in": 7, "records_out": 14},
    ]
    # a scrape twice does not add the earlier attempts twice (rows are copies)
    assert next(iter(stats.task_rows()))["operator_records"] == rows[0]["operator_records"]

    text = stats.render().decode()
    assert (
        'aiostream_operator_records_in_total{operator="keep",subtask="0",vertex="steps",'
        'worker="0"} 15.0' in text
    )
    assert (
        'aiostream_operator_records_out_total{operator="twice",subtask="1",vertex="steps",'
        'worker="0"} 4.0' in text
    )
