"""/operators' and /metrics' per-vertex figures: a chain's subtasks summed, wherever they ran.

With ``job.workers`` > 1 a vertex's subtasks report from different
processes; a reader of the per-subtask rows had to add them up, where
Flink's web UI shows the vertex's totals first. A dead worker's subtasks
still count as last reported (its records were processed).
"""

from __future__ import annotations

from typing import Any

from aiostream_ckpt.daemon.vertices import vertex_rows


def row(task: str, subtask: int, worker: int | None, **figures: Any) -> dict[str, Any]:
    base = {
        "task": task,
        "subtask": subtask,
        "parallelism": 2,
        "operators": [task.rsplit("-", 1)[0], "pv-sink"],
        "worker": worker,
        "pid": 100 + (worker or 0),
        "live": True,
        "state": "running",
        "records_in": 0,
        "records_out": 0,
        "records_in_per_second": 0.0,
        "records_out_per_second": 0.0,
        "backpressure_ratio": 0.0,
    }
    return {**base, **figures}


def test_a_vertex_sums_its_subtasks_over_every_worker() -> None:
    rows = [
        row("pv-count-0", 0, 0, records_in=700, records_out=690, records_in_per_second=10.04),
        row("pv-count-1", 1, 1, records_in=300, records_out=300, records_in_per_second=5.02,
            backpressure_ratio=0.6, live=False, state="failed"),
        row("events-10", 10, None, records_in=5, parallelism=11),
    ]  # fmt: skip
    vertices = {v["vertex"]: v for v in vertex_rows(rows)}
    count = vertices["pv-count"]
    assert (count["records_in"], count["records_out"]) == (1000, 990)
    assert count["records_in_per_second"] == 15.1
    assert count["backpressure_ratio"] == 0.6 and count["backpressure"] == "high"
    assert count["live_subtasks"] == 1 and count["workers"] == [0, 1]
    assert [(s["subtask"], s["worker"], s["state"]) for s in count["subtasks"]] == [
        (0, 0, "running"),
        (1, 1, "failed"),
    ]
    # a subtask id ends in its index, whatever its digits: "events-10" is vertex "events"
    assert vertices["events"]["records_in"] == 5 and vertices["events"]["workers"] == [None]
