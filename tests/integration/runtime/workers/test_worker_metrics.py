"""job.workers=2: REST, ``/metrics``, the progress line and ``checkpoints inspect`` see the workers.

Real worker processes throughout: the daemon runs in this process (its REST
app served by aiohttp's test server) or as ``aiostream-ckpt run``; the
subtasks run in two workers that report their figures over the control
connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from aiostream_ckpt.api.environment import StreamEnvironment
from aiostream_ckpt.daemon.app_loader import build_app
from aiostream_ckpt.daemon.config import load_config
from aiostream_ckpt.daemon.rest import build_app as rest_app
from aiostream_ckpt.daemon.service import JobDaemon
from aiostream_ckpt.daemon.settings import DaemonSettings
from aiostream_ckpt.runtime.job import JobStatus
from aiostream_ckpt.runtime.workers.worker_process import WorkerLaunch
from tests.helpers import cli, generated_pv_args

pytestmark = pytest.mark.integration

EVENTS = 6_000
TASKS = {"events-0", "events-1", "pv-count-0", "pv-count-1"}
_STARTED = re.compile(r"worker (\d+) started \(pid (\d+)\)")


def pv_sets(tmp: Path, *extra: str) -> list[str]:
    return [
        f"checkpoint.dir={tmp / 'ckpt'}",
        f"app.output={tmp / 'out'}",
        "app.splits=2",
        "app.keys=50",
        "job.parallelism=2",
        "job.workers=2",
        "checkpoint.interval=50ms",
        *extra,
    ]


def daemon_for(sets: list[str], app: str = "apps.pv_count") -> JobDaemon:
    """``app``'s daemon in this process, its subtasks in two worker processes."""
    loaded = load_config(None, env={}, sets=sets)
    env = StreamEnvironment(app.rsplit(".", 1)[-1], config=loaded.job, params=loaded.params)
    build_app(app, env)
    launch = WorkerLaunch(app, None, tuple(sets), workers=2)
    return JobDaemon(env.spec(), DaemonSettings(rest_enabled=False), launch=launch)


@contextlib.asynccontextmanager
async def serve(daemon: JobDaemon) -> AsyncIterator[TestClient[Any, Any]]:
    """The daemon's REST app on a test server (its handlers, the daemon's live views)."""
    client: TestClient[Any, Any] = TestClient(TestServer(rest_app(daemon, None)))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


async def get(client: TestClient[Any, Any], path: str) -> Any:
    resp = await client.get(path)
    assert resp.status == 200, path
    return await (resp.json() if resp.content_type == "application/json" else resp.text())


async def rows_when(
    client: TestClient[Any, Any], predicate: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """``/operators``' rows by task, polled until ``predicate`` holds for them (bounded)."""
    async with asyncio.timeout(60):
        while True:
            body = await get(client, "/operators")
            rows = {r["task"]: r for r in body["tasks"]}
            if predicate(rows):
                return rows
            await asyncio.sleep(0.01)


def all_live(rows: dict[str, Any]) -> bool:
    return set(rows) == TASKS and all(r["live"] and r["records_in"] > 0 for r in rows.values())


def samples(text: str, name: str) -> dict[str, float]:
    """``name``'s samples in a Prometheus text page: label set -> value."""
    found = re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE)
    return {labels: float(value) for labels, value in found}


async def test_rest_and_metrics_show_every_subtask_of_both_workers(tmp_path: Path) -> None:
    daemon = daemon_for(pv_sets(tmp_path, f"app.generate={EVENTS}"))
    async with serve(daemon) as client:
        result = await daemon.run()
        assert result.status is JobStatus.FINISHED

        operators = await get(client, "/operators")
        rows = {r["task"]: r for r in operators["tasks"]}
        assert set(rows) == TASKS
        pids = {r["worker"]: r["pid"] for r in rows.values()}
        # subtask i ran in worker i % 2, a process of its own (not this one)
        assert all(r["worker"] == r["subtask"] % 2 for r in rows.values())
        assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
        assert all(r["records_in"] > 0 and r["state"] == "finished" for r in rows.values())
        sources = [r for r in rows.values() if r["source"]]
        assert sum(r["records_in"] for r in sources) == EVENTS
        counts = [r for r in rows.values() if "pv-count" in r["operators"]]
        assert sum(r["records_in"] for r in counts) == EVENTS
        assert sum(r["records_out"] for r in counts) == EVENTS
        assert [r["last_checkpoint_acked"] for r in rows.values()] == [result.last_checkpoint] * 4
        # per vertex, as Flink's web UI: the sum over its subtasks in both workers, then each
        vertices = {v["vertex"]: v for v in operators["vertices"]}
        assert set(vertices) == {"events", "pv-count"}
        for name, v in vertices.items():
            subs = [r for r in rows.values() if r["task"].startswith(f"{name}-")]
            assert v["records_in"] == sum(r["records_in"] for r in subs), name
            assert v["records_out"] == sum(r["records_out"] for r in subs), name
            assert sorted(v["workers"]) == [0, 1] and v["parallelism"] == 2, name
            assert sorted(s["subtask"] for s in v["subtasks"]) == [0, 1], name
        assert vertices["events"]["records_in"] == EVENTS
        assert vertices["pv-count"]["records_in"] == vertices["pv-count"]["records_out"] == EVENTS

        job = await get(client, "/job")
        tasks = {t["id"]: t for t in job["graph"]["tasks"]}
        assert set(tasks) == TASKS
        assert {t["worker"]: t["pid"] for t in tasks.values()} == pids

        text = await get(client, "/metrics")
        rec_in = samples(text, "aiostream_records_in_total")
        for tid, r in rows.items():
            labels = (
                f'operator="{r["operators"][0]}",subtask="{r["subtask"]}",task="{tid}",'
                f'worker="{r["worker"]}"'
            )
            assert rec_in[labels] == r["records_in"], labels
        assert sum(v for k, v in rec_in.items() if 'operator="events"' in k) == EVENTS
        assert samples(text, "aiostream_vertex_records_in_total") == {
            'operator="events",vertex="events"': EVENTS,
            'operator="pv-count",vertex="pv-count"': EVENTS,
        }
        assert (
            samples(text, "aiostream_vertex_records_out_total")[
                'operator="pv-sink",vertex="pv-count"'
            ]
            == EVENTS
        )
        # the job ended: the workers stopped, and say so
        assert samples(text, "aiostream_worker_up") == {'worker="0"': 0.0, 'worker="1"': 0.0}


async def test_each_chained_operators_records_are_summed_over_both_workers(
    tmp_path: Path,
) -> None:
    """map -> filter -> flat_map chained after the source: what each one took and emitted.

    Before, only the chain's ends were counted (records into the task, out of
    it): the filter's drops and the flat_map's copies showed nowhere.
    """
    daemon = daemon_for(pv_sets(tmp_path, f"app.generate={EVENTS}"), "tests.apps.chained_steps")
    async with serve(daemon) as client:
        assert (await daemon.run()).status is JobStatus.FINISHED
        operators = await get(client, "/operators")
        (vertex,) = operators["vertices"]
        assert vertex["operators"] == ["events", "seq", "thirds", "twice", "out"]
        assert sorted(vertex["workers"]) == [0, 1]
        kept = EVENTS // 3
        assert vertex["operator_records"] == [
            {"operator": "seq", "records_in": EVENTS, "records_out": EVENTS},
            {"operator": "thirds", "records_in": EVENTS, "records_out": kept},
            {"operator": "twice", "records_in": kept, "records_out": 2 * kept},
        ]
        # the vertex-level fields as before: the chain's ends
        assert (vertex["records_in"], vertex["records_out"]) == (EVENTS, 2 * kept)
        # each subtask's own, in its worker, add up to the vertex's
        rows = operators["tasks"]
        assert sorted(r["worker"] for r in rows) == [0, 1]
        for i, total in enumerate(vertex["operator_records"]):
            assert total["records_out"] == sum(
                r["operator_records"][i]["records_out"] for r in rows
            )
            assert all(r["operator_records"][i]["records_out"] > 0 for r in rows)

        text = await get(client, "/metrics")
        for kind in ("in", "out"):
            series = samples(text, f"aiostream_operator_records_{kind}_total")
            assert len(series) == 3 * 2, series  # 3 chained operators x 2 subtasks
            for r in rows:
                for op in r["operator_records"]:
                    labels = (
                        f'operator="{op["operator"]}",subtask="{r["subtask"]}",'
                        f'vertex="events",worker="{r["worker"]}"'
                    )
                    assert series[labels] == op[f"records_{kind}"], labels


async def test_a_dead_workers_subtasks_show_failed_until_the_restart(tmp_path: Path) -> None:
    # paced and endless: the job runs until cancelled
    sets = pv_sets(tmp_path, "app.generate=100000000", "app.rate=500", "restart.delay=1s")
    daemon = daemon_for(sets)
    job = asyncio.create_task(daemon.run())
    try:
        async with serve(daemon) as client:
            before = await rows_when(client, all_live)
            victim = before["events-1"]["pid"]
            # each worker process as the main process hears it (its heartbeats)
            procs = {p["worker"]: p for p in (await get(client, "/job"))["workers"]}
            assert {i: p["pid"] for i, p in procs.items()} == {
                0: before["events-0"]["pid"],
                1: victim,
            }
            assert all(p["status"] == "running" for p in procs.values())
            assert all(0 <= p["heartbeat_age_s"] < 20 for p in procs.values()), procs
            heard = samples(await get(client, "/metrics"), "aiostream_worker_heartbeat_age_seconds")
            assert set(heard) == {'worker="0"', 'worker="1"'} and max(heard.values()) < 20
            os.kill(victim, signal.SIGKILL)
            after = await rows_when(client, lambda rs: not rs["events-1"]["live"])
            # the dead worker's subtasks: failed, no rates or queues presented as current
            for tid in ("events-1", "pv-count-1"):
                r = after[tid]
                assert r["pid"] == victim and r["state"] == "failed", r
                assert r["records_in_per_second"] == 0.0 and r["backpressure_ratio"] == 0.0
                assert r["source_lag"] == {} and r["output_queue_fill"] == 0.0
            text = await get(client, "/metrics")
            assert samples(text, "aiostream_worker_up")['worker="1"'] == 0.0
            assert not any('worker="1"' in k for k in samples(text, "aiostream_source_lag"))
            heard = samples(text, "aiostream_worker_heartbeat_age_seconds")
            assert 'worker="1"' not in heard  # a dead worker's silence is no figure

            # the restart's workers report afresh
            await rows_when(client, lambda rs: all_live(rs) and rs["events-1"]["pid"] != victim)
            assert daemon.runner.run_state.attempt == 1
    finally:
        daemon.runner.cancel()
        await asyncio.gather(job, return_exceptions=True)


def test_progress_line_and_checkpoints_inspect_cover_the_workers(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    args = generated_pv_args(ckpt, tmp_path / "out", events=EVENTS, keys=50)
    result = cli(*args, "--set", "job.workers=2", "--progress", "0.05", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    progress = re.findall(r"^progress: events=(\d+) ", result.stderr, re.MULTILINE)
    assert progress and int(progress[-1]) == EVENTS, result.stderr[-3000:]

    pids = {int(i): int(p) for i, p in _STARTED.findall(result.stderr)}
    assert sorted(pids) == [0, 1]
    shown = cli("checkpoints", "inspect", str(ckpt))
    assert shown.returncode == 0, shown.stderr
    info = orjson.loads(shown.stdout)
    assert info["final"] and set(info["tasks"]) == TASKS
    for tid, ack in info["tasks"].items():
        sub = int(tid.rsplit("-", 1)[1])
        assert (ack["worker"], ack["pid"]) == (sub % 2, pids[sub % 2]), tid
    # each subtask's state, both workers' (the counts' keyed state in their LMDB snapshots)
    per_sub = info["subtask_state_bytes"]
    assert set(per_sub["pv-count"]) == {"0", "1"}
    assert all(n > 0 for n in per_sub["pv-count"].values())
    assert sum(per_sub["pv-count"].values()) == info["operator_state_bytes"]["pv-count"]
