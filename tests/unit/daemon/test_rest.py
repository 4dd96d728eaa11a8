"""REST API in-process: read calls on loopback, 401s for mutating calls, savepoints, OpenAPI."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.checkpoint.storage import read_checkpoint
from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink
from aiostream_ckpt.connectors.generator import GeneratorSource
from aiostream_ckpt.daemon.metrics import JobStats
from aiostream_ckpt.daemon.openapi import SPEC
from aiostream_ckpt.daemon.rest import authorized, build_app
from aiostream_ckpt.daemon.service import JobDaemon
from aiostream_ckpt.daemon.settings import DaemonSettings
from aiostream_ckpt.jobspec.config import CheckpointConfig, JobConfig
from aiostream_ckpt.runtime.job import JobStatus
from apps.pv_count import CountPageViews, app_id
from tests.helpers import wait_until

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MUTATING = ["/savepoints", "/savepoints/dispose", "/job/stop-with-savepoint", "/job/cancel"]


def paced_pv_job(tmp_path: Path, *, reinterpret: bool = False) -> StreamEnvironment:
    """pv_count on a paced generator; ``reinterpret``: at parallelism 1, without a shuffle."""
    config = JobConfig(
        parallelism=1 if reinterpret else 2,
        checkpoint=CheckpointConfig(directory=tmp_path / "ckpt", interval=0.05),
    )
    env = StreamEnvironment("pv", config=config)
    source = GeneratorSource(None, keys=20, splits=2, rate=2000)
    events = env.from_source(source, uid="events")
    # one subtask owns every key group: any input is partitioned for it
    keyed = events.reinterpret_as_keyed(app_id) if reinterpret else events.key_by(app_id)
    counts = keyed.process(CountPageViews(), uid="pv-count")
    counts.sink_to(ExactlyOnceFileSink(tmp_path / "out"), uid="pv-sink")
    return env


class Running:
    def __init__(self, daemon: JobDaemon, client: TestClient[Any, Any], job: asyncio.Task[Any]):
        self.daemon = daemon
        self.client = client
        self.job = job


async def start(
    tmp_path: Path, token: str | None, *, reinterpret: bool = False
) -> AsyncIterator[Running]:
    spec = paced_pv_job(tmp_path, reinterpret=reinterpret).spec()
    daemon = JobDaemon(spec, DaemonSettings(rest_enabled=False))
    job = asyncio.create_task(daemon.run())
    client: TestClient[Any, Any] = TestClient(TestServer(build_app(daemon, token)))
    await client.start_server()
    try:
        await wait_until(lambda: daemon.runner.run_state.last_checkpoint() is not None)
        yield Running(daemon, client, job)
    finally:
        await client.close()
        daemon.runner.cancel()
        await asyncio.gather(job, return_exceptions=True)


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    async for r in start(tmp_path, TOKEN):
        yield r


@pytest.fixture
async def tokenless(tmp_path: Path) -> AsyncIterator[Running]:
    async for r in start(tmp_path, None):
        yield r


@pytest.fixture
async def reinterpreted(tmp_path: Path) -> AsyncIterator[Running]:
    async for r in start(tmp_path, TOKEN, reinterpret=True):
        yield r


async def get(r: Running, path: str, **kw: Any) -> tuple[int, Any]:
    resp = await r.client.get(path, **kw)
    body = await (resp.json() if resp.content_type == "application/json" else resp.text())
    return resp.status, body


async def post(r: Running, path: str, **kw: Any) -> tuple[int, Any]:
    resp = await r.client.post(path, **kw)
    return resp.status, await resp.json()


async def test_read_calls_work_on_loopback_without_token(running: Running) -> None:
    status, health = await get(running, "/health")
    assert (status, health) == (200, {"status": "ok", "job": "running"})

    status, job = await get(running, "/job")
    assert status == 200 and job["status"] == "running" and job["attempt"] == 0
    ops = {o["uid"]: o for o in job["graph"]["operators"]}
    assert ops["pv-count"]["parallelism"] == 2 and ops["pv-count"]["partitioning"] == "hash"
    tasks = {t["id"]: t for t in job["graph"]["tasks"]}
    assert tasks["pv-count-1"]["operators"] == ["pv-count", "pv-sink"]

    await wait_until(
        lambda: running.daemon.stats.rates(running.daemon.runner.run_state.tasks[0])[0] > 0
    )
    status, operators = await get(running, "/operators")
    rows = {t["task"]: t for t in operators["tasks"]}
    assert rows["events-0"]["records_in_per_second"] > 0
    assert rows["events-0"]["source_lag"] == {}  # unbounded generator: no lag to report
    assert 0.0 <= rows["pv-count-0"]["input_queue_fill"] <= 1.0
    assert rows["pv-count-0"]["backpressure"] in ("ok", "low", "high")

    status, chks = await get(running, "/checkpoints")
    assert status == 200 and chks["counts"]["completed"] >= 1
    first = chks["history"][0]
    assert {
        "id",
        "duration_ms",
        "size_bytes",
        "sync_ms_max",
        "async_ms_max",
        "alignment_ms_max",
        "unaligned",
        "in_flight_records",
        "in_flight_bytes",
    } <= set(first)
    assert first["unaligned"] is False and first["in_flight_bytes"] == 0  # aligned

    status, latest = await get(running, "/checkpoints/latest")
    assert status == 200 and latest["size_bytes"] > 0
    assert Path(latest["path"]).is_dir()  # noqa: ASYNC240 - a test, not a server

    status, text = await get(running, "/metrics")
    assert status == 200
    for name in (
        'aiostream_records_in_total{operator="events",subtask="0",task="events-0"}',
        'aiostream_checkpoints_total{kind="checkpoint",status="completed"}',
        "aiostream_checkpoint_duration_seconds_bucket",
        'aiostream_input_queue_fill_ratio{task="pv-count-0"}',
        'aiostream_job_status{status="running"} 1.0',
    ):
        assert name in text, name


async def test_job_plan_shows_a_reinterpreted_keyed_edge_forward_and_chained(
    reinterpreted: Running,
) -> None:
    status, job = await get(reinterpreted, "/job")
    assert status == 200
    ops = {o["uid"]: o for o in job["graph"]["operators"]}
    assert ops["pv-count"]["partitioning"] == "forward_keyed"
    # one task: source, the key-group arrival check, the count and the sink
    [task] = job["graph"]["tasks"]
    assert task["operators"] == ["events", "pv-count.key-groups", "pv-count", "pv-sink"]


@pytest.mark.parametrize("path", MUTATING)
async def test_mutating_calls_need_the_token(running: Running, path: str) -> None:
    status, body = await post(running, path)
    assert status == 401 and body["error"] == "missing bearer token"
    status, body = await post(running, path, headers={"Authorization": "Bearer nope"})
    assert status == 401 and body["error"] == "wrong bearer token"
    assert running.daemon.runner.run_state.status is JobStatus.RUNNING


async def test_without_a_configured_token_mutating_calls_are_disabled(tokenless: Running) -> None:
    status, body = await post(tokenless, "/job/cancel", headers=AUTH)
    assert status == 401 and "no rest.token" in body["error"]
    assert (await get(tokenless, "/job"))[0] == 200


async def test_savepoint_is_self_contained_and_job_goes_on(
    running: Running, tmp_path: Path
) -> None:
    status, sp = await post(
        running, "/savepoints", headers=AUTH, json={"directory": str(tmp_path / "sp")}
    )
    assert status == 200, sp
    path = Path(sp["path"])
    assert path.parent == tmp_path / "sp"
    chk = read_checkpoint(path)
    assert chk.is_savepoint and chk.checkpoint_id == sp["id"] and chk.root == path
    assert all(
        f.startswith(path.name) or not f.startswith("shared") for f in chk.referenced_files()
    )
    status, default = await post(running, "/savepoints", headers=AUTH)
    assert status == 200 and Path(default["path"]).parent == tmp_path / "ckpt" / "savepoints"
    assert running.daemon.runner.run_state.status is JobStatus.RUNNING
    _, chks = await get(running, "/checkpoints")
    assert chks["counts"]["savepoints_completed"] == 2


def copies(savepoint: str) -> list[str]:
    return [str(p) for p in Path(savepoint).glob("*/held-writer/part-*.jsonl")]


def exists(*paths: str) -> bool:
    return any(Path(p).exists() for p in paths)


async def test_dispose_removes_a_savepoint_and_its_copies(running: Running, tmp_path: Path) -> None:
    by_id, by_path = [(await post(running, "/savepoints", headers=AUTH))[1] for _ in range(2)]
    held = copies(by_id["path"])
    assert held, "the savepoint holds copies of the output it pre-committed"
    status, body = await post(
        running, "/savepoints/dispose", headers=AUTH, json={"savepoint": by_id["id"]}
    )
    assert status == 200, body
    assert body["id"] == by_id["id"] and body["disposed"] and body["path"] == by_id["path"]
    assert not exists(by_id["path"], *held)
    status, body = await post(
        running, "/savepoints/dispose", headers=AUTH, json={"savepoint": by_path["path"]}
    )
    assert status == 200 and not exists(by_path["path"])
    status, body = await post(
        running, "/savepoints/dispose", headers=AUTH, json={"savepoint": str(by_id["id"])}
    )
    assert status == 404 and f"no savepoint {by_id['id']}" in body["error"]
    assert running.daemon.runner.run_state.status is JobStatus.RUNNING


async def test_dispose_refuses_what_is_not_a_savepoint(running: Running, tmp_path: Path) -> None:
    chk = (await get(running, "/checkpoints/latest"))[1]["path"]
    status, body = await post(running, "/savepoints/dispose", headers=AUTH, json={"savepoint": chk})
    assert status == 400 and "is a checkpoint, not a savepoint" in body["error"]
    assert Path(chk).exists()  # noqa: ASYNC240 - a test, not a server
    other = tmp_path / "precious"
    other.mkdir()
    status, body = await post(
        running, "/savepoints/dispose", headers=AUTH, json={"savepoint": str(other)}
    )
    assert status == 400 and "not a readable savepoint" in body["error"]
    assert other.exists()
    for bad in ({}, {"savepoint": ""}, {"savepoint": True}, {"savepoint": 1, "x": 2}):
        status, body = await post(running, "/savepoints/dispose", headers=AUTH, json=bad)
        assert status == 400, bad


async def test_dispose_refuses_the_savepoint_the_job_restored_from(tmp_path: Path) -> None:
    """Until a checkpoint completes, a failure would restore it again: refused, then allowed."""
    async for first in start(tmp_path / "a", TOKEN):
        sp = (await post(first, "/savepoints", headers=AUTH))[1]
    spec = paced_pv_job(tmp_path / "b").spec()
    config = dataclasses.replace(
        spec.config,
        restore_from=Path(sp["path"]),
        checkpoint=dataclasses.replace(spec.config.checkpoint, interval=3600.0),
    )
    daemon = JobDaemon(dataclasses.replace(spec, config=config), DaemonSettings(rest_enabled=False))
    job = asyncio.create_task(daemon.run())
    client: TestClient[Any, Any] = TestClient(TestServer(build_app(daemon, TOKEN)))
    await client.start_server()
    r = Running(daemon, client, job)
    try:
        await wait_until(lambda: daemon.runner.run_state.status is JobStatus.RUNNING)
        status, body = await post(
            r, "/savepoints/dispose", headers=AUTH, json={"savepoint": sp["path"]}
        )
        assert status == 409, body
        assert "would restore it after a failure" in body["error"]
        assert exists(f"{sp['path']}/_metadata")
        coordinator = daemon.runner.run_state.coordinator
        assert coordinator is not None
        await coordinator.trigger()  # a checkpoint completes: the job no longer needs it
        status, body = await post(
            r, "/savepoints/dispose", headers=AUTH, json={"savepoint": sp["path"]}
        )
        assert status == 200, body
    finally:
        await client.close()
        daemon.runner.cancel()
        await asyncio.gather(job, return_exceptions=True)


async def test_bad_savepoint_body_is_400(running: Running) -> None:
    status, body = await post(running, "/savepoints", headers=AUTH, json={"dir": "x"})
    assert status == 400 and "directory" in body["error"]


async def test_stop_with_savepoint_then_status(running: Running) -> None:
    status, sp = await post(running, "/job/stop-with-savepoint", headers=AUTH)
    assert status == 200 and (Path(sp["path"]) / "_metadata").exists()
    # answered once the job ended: how it ended, and that its output is committed
    assert sp["job"] == "stopped_with_savepoint" and sp["output_committed"] is True
    result = await asyncio.wait_for(running.job, 10)
    assert result.status is JobStatus.STOPPED_WITH_SAVEPOINT
    assert running.daemon.savepoints.final_savepoint is not None
    # no checkpoint may complete after a stop-with-savepoint's savepoint
    assert result.last_checkpoint is None or result.last_checkpoint < sp["id"]


async def test_cancel(running: Running) -> None:
    status, body = await post(running, "/job/cancel", headers=AUTH)
    assert (status, body) == (202, {"status": "canceling"})
    assert (await asyncio.wait_for(running.job, 10)).status is JobStatus.CANCELED


async def test_savepoint_refused_when_job_not_running(running: Running) -> None:
    running.daemon.runner.run_state.status = JobStatus.RESTARTING
    status, body = await post(running, "/savepoints", headers=AUTH)
    assert status == 409 and "restarting" in body["error"]
    running.daemon.runner.run_state.status = JobStatus.RUNNING


def _request(method: str, path: str, peer: str, headers: dict[str, str] | None = None) -> Any:
    class Transport:
        def get_extra_info(self, name: str, default: Any = None) -> Any:
            return (peer, 40000) if name == "peername" else default

    return make_mocked_request(method, path, headers=headers, transport=Transport())


def test_remote_peers_need_the_token_even_to_read() -> None:
    assert authorized(_request("GET", "/job", "127.0.0.1"), TOKEN) is None
    assert authorized(_request("GET", "/job", "::1"), TOKEN) is None
    assert authorized(_request("GET", "/job", "10.1.2.3"), TOKEN) == "missing bearer token"
    assert authorized(_request("GET", "/job", "10.1.2.3", AUTH), TOKEN) is None
    assert authorized(_request("GET", "/health", "10.1.2.3"), TOKEN) is None
    assert authorized(_request("POST", "/job/cancel", "127.0.0.1"), TOKEN) == "missing bearer token"


def test_a_read_token_reads_from_remote_peers_but_cannot_control() -> None:
    read = {"Authorization": "Bearer sc4pe"}
    assert authorized(_request("GET", "/metrics", "10.1.2.3", read), TOKEN, "sc4pe") is None
    assert authorized(_request("GET", "/job", "10.1.2.3", AUTH), TOKEN, "sc4pe") is None
    assert authorized(_request("GET", "/metrics", "10.1.2.3"), TOKEN, "sc4pe") == (
        "missing bearer token"
    )
    wrong = {"Authorization": "Bearer nope"}
    assert authorized(_request("GET", "/job", "10.1.2.3", wrong), TOKEN, "sc4pe") == (
        "wrong bearer token"
    )
    refused = authorized(_request("POST", "/job/cancel", "10.1.2.3", read), TOKEN, "sc4pe")
    assert refused == "rest.read_token allows reads only; job control needs rest.token"
    refused = authorized(_request("POST", "/job/cancel", "127.0.0.1", read), TOKEN, "sc4pe")
    assert refused is not None and "reads only" in refused
    # a read token alone (no control token) still reads, and control stays disabled
    assert authorized(_request("GET", "/metrics", "10.1.2.3", read), None, "sc4pe") is None
    refused = authorized(_request("POST", "/savepoints", "10.1.2.3", read), None, "sc4pe")
    assert refused == "mutating calls are disabled: no rest.token is configured"


async def test_unknown_paths_and_methods_answer_json(running: Running) -> None:
    resp = await running.client.get("/nope")
    assert resp.status == 404 and resp.content_type == "application/json"
    body = await resp.json()
    assert "/nope" in body["error"] and "/openapi.json" in body["error"]
    resp = await running.client.delete("/job", headers=AUTH)
    assert resp.status == 405 and resp.content_type == "application/json", await resp.text()
    assert "DELETE" in (await resp.json())["error"] and "GET" in resp.headers["Allow"]


def test_openapi_describes_exactly_the_routes() -> None:
    app = build_app(None, TOKEN)  # type: ignore[arg-type]
    routes = {
        (r.resource.canonical, r.method.lower())
        for r in app.router.routes()
        if r.method != "HEAD" and r.resource is not None
    }
    documented = {(path, m) for path, ops in SPEC["paths"].items() for m in ops}
    assert routes == documented
    assert SPEC["openapi"].startswith("3.")
    for path, ops in SPEC["paths"].items():
        for method, op in ops.items():
            assert "200" in op["responses"] or "202" in op["responses"], (path, method)
            if method == "post":
                assert op["security"] == [{"bearer": []}] and "401" in op["responses"]


async def test_failed_stop_with_savepoint_leaves_the_job_running(
    running: Running, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    status, body = await post(
        running, "/job/stop-with-savepoint", headers=AUTH, json={"directory": str(blocker)}
    )
    assert status == 500 and "cannot create savepoint directory" in body["error"]
    run = running.daemon.runner.run_state
    before = run.last_checkpoint() or 0
    await wait_until(lambda: (run.last_checkpoint() or 0) > before)  # periodic ones resumed
    assert run.status is JobStatus.RUNNING and not running.daemon.savepoints.stopping


async def test_the_checkpoint_history_keeps_the_newest_100_entries() -> None:
    """A full history is a fixed cost reached in 100 s of 1 s checkpoints, not 17 minutes.

    It kept 1000 entries (~465 bytes each): at 1 s checkpoints RSS rose for
    the soak's first 17 minutes, past a 12-minute warm-up.
    """
    stats = JobStats(ManualClock().monotonic)
    for cid in range(1, 1001):
        stats.on_history({"id": cid, "status": "completed", "duration_ms": 1.0})
    assert [e["id"] for e in stats.history] == list(range(901, 1001))
    assert stats.counts == {("checkpoint", "completed"): 1000}
