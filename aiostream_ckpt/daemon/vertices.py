"""Figures per job vertex and per chained operator, summed over subtasks in every process.

A vertex is a chain of operators run as ``parallelism`` subtasks (Flink's
job vertex; its subtasks are ``<vertex>-<i>``). Flink's web UI shows a
vertex's records as the sum over its subtasks, then each subtask, and its
operator-scope metrics (``numRecordsIn/Out``) per operator inside the chain:
what a filter drops or a flat_map expands. With ``job.workers`` > 1 the
subtasks report from different processes; these sums spare a reader the
adding up.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric

#: Flink's backpressure levels: ratio of backpressured samples.
_BP_LOW, _BP_HIGH = 0.10, 0.50

#: a subtask's figures as its vertex lists it (the whole row is in ``tasks``)
_SUBTASK_KEYS = ("subtask", "task", "worker", "pid", "live", "state", "records_in", "records_out")


def backpressure_level(ratio: float) -> str:
    if ratio > _BP_HIGH:
        return "high"
    return "low" if ratio > _BP_LOW else "ok"


def worker_name(worker: int | None) -> str:
    """Return a series' ``worker`` label: the worker's index, ``main`` for the main process."""
    return "main" if worker is None else str(worker)


def vertex_name(row: dict[str, Any]) -> str:
    """Return a subtask row's job vertex: its task id without the ``-<subtask>`` suffix."""
    return str(row["task"]).removesuffix(f"-{row['subtask']}")


def vertex_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sum subtask rows (``JobStats.task_rows``) per job vertex, wherever they run.

    Records and rates are summed, backpressure is the worst subtask's (as
    Flink shows it); ``operator_records`` sums each chained operator's
    records over the subtasks.
    """
    vertices: dict[str, dict[str, Any]] = {}
    for row in rows:
        name = vertex_name(row)
        v = vertices.get(name)
        if v is None:
            v = vertices[name] = {
                "vertex": name,
                "operators": row["operators"],
                "parallelism": row["parallelism"],
                "records_in": 0,
                "records_out": 0,
                "records_in_per_second": 0.0,
                "records_out_per_second": 0.0,
                "operator_records": [
                    {"operator": r["operator"], "records_in": 0, "records_out": 0}
                    for r in row.get("operator_records", ())
                ],
                "backpressure_ratio": 0.0,
                "live_subtasks": 0,
                "workers": [],
                "subtasks": [],
            }
        for key in ("records_in", "records_out", "records_in_per_second", "records_out_per_second"):
            v[key] += row[key]
        for total, r in zip(v["operator_records"], row.get("operator_records", ()), strict=False):
            total["records_in"] += r["records_in"]
            total["records_out"] += r["records_out"]
        v["backpressure_ratio"] = max(v["backpressure_ratio"], row["backpressure_ratio"])
        v["live_subtasks"] += 1 if row["live"] else 0
        if row["worker"] not in v["workers"]:
            v["workers"].append(row["worker"])
        v["subtasks"].append({k: row[k] for k in _SUBTASK_KEYS})
    for v in vertices.values():
        v["records_in_per_second"] = round(v["records_in_per_second"], 1)
        v["records_out_per_second"] = round(v["records_out_per_second"], 1)
        v["backpressure"] = backpressure_level(v["backpressure_ratio"])
    return list(vertices.values())


def vertex_families(rows: list[dict[str, Any]]) -> Iterable[Metric]:
    """Yield the records in and out per job vertex, summed over its subtasks in every process."""
    labels = ["vertex", "operator"]
    rec_in = CounterMetricFamily(
        "aiostream_vertex_records_in",
        "Records into a job vertex (its chain's first operator), summed over its subtasks.",
        labels=labels,
    )
    rec_out = CounterMetricFamily(
        "aiostream_vertex_records_out",
        "Records out of a job vertex (its chain's last operator), summed over its subtasks.",
        labels=labels,
    )
    for v in vertex_rows(rows):
        rec_in.add_metric([v["vertex"], v["operators"][0]], float(v["records_in"]))
        rec_out.add_metric([v["vertex"], v["operators"][-1]], float(v["records_out"]))
    yield from (rec_in, rec_out)


def operator_families(rows: list[dict[str, Any]], worker_label: bool) -> Iterable[Metric]:
    """Yield each chained operator's records in and out per subtask (Flink's operator scope).

    ``worker_label``: the subtasks run in worker processes (``job.workers`` > 1),
    their series carry the ``worker`` label as the per-task ones do.
    """
    labels = ["vertex", "operator", "subtask", *(["worker"] if worker_label else [])]
    rec_in = CounterMetricFamily(
        "aiostream_operator_records_in",
        "Records into an operator of a chain, per subtask (Flink's numRecordsIn).",
        labels=labels,
    )
    rec_out = CounterMetricFamily(
        "aiostream_operator_records_out",
        "Records an operator of a chain emitted, per subtask (Flink's numRecordsOut).",
        labels=labels,
    )
    for row in rows:
        vertex, sub = vertex_name(row), str(row["subtask"])
        w = [worker_name(row["worker"])] if worker_label else []
        for r in row.get("operator_records", ()):
            rec_in.add_metric([vertex, r["operator"], sub, *w], float(r["records_in"]))
            rec_out.add_metric([vertex, r["operator"], sub, *w], float(r["records_out"]))
    yield from (rec_in, rec_out)
