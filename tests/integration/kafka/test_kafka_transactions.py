"""Transactions you can see: the sink's view (REST, metric, age warning) against the real broker."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.generator import GeneratorSource, write_generated_jsonl
from aiostream_ckpt.connectors.kafka.sink import KafkaSink
from aiostream_ckpt.daemon.rest import build_app
from aiostream_ckpt.daemon.service import JobDaemon
from aiostream_ckpt.daemon.settings import DaemonSettings
from aiostream_ckpt.jobspec.config import CheckpointConfig, JobConfig
from aiostream_ckpt_dev.demo.kafka import load_jsonl
from aiostream_ckpt_dev.recount import check_pv_updates, recount_inputs
from apps.pv_count import CountPageViews, app_id
from tests.helpers import REPO, cli, cli_cmd, stable_equals_high_watermark, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

CRASH_APP = Path(__file__).parent / "crash_at_commit_app.py"


async def test_writer_reports_ages_and_warns_near_the_timeout(kafka_broker, new_topic, caplog):
    clock = ManualClock()
    topic = await new_topic(1)
    sink = KafkaSink(
        topic,
        kafka_broker.bootstrap_servers,
        transactional_id_prefix=f"age-{uuid.uuid4().hex[:8]}",
        transaction_timeout_ms=10_000,
    )
    writer = sink.create_writer(ConnectorContext("job", "sink", 0, 1, clock=clock))
    await writer.recover(None, None)
    try:
        assert writer.transactions() == [] and writer.oldest_transaction_age() == 0
        await writer.write([{"k": 1}])
        clock.advance(7.0)
        (row,) = writer.transactions()
        assert row["state"] == "open" and row["age_seconds"] == 7.0
        assert row["timeout_seconds"] == 10.0 and row["checkpoint_id"] is None
        with caplog.at_level(logging.WARNING):
            writer.check_transaction_ages()  # 70 %: quiet
            assert not [r for r in caplog.records if "has been open" in r.getMessage()]
            clock.advance(1.5)
            writer.check_transaction_ages()  # 85 %: warned once
            writer.check_transaction_ages()
        warnings = [r.getMessage() for r in caplog.records if "has been open" in r.getMessage()]
        assert len(warnings) == 1 and row["transactional_id"] in warnings[0], warnings
        await writer.prepare_commit(1)
        (row,) = writer.transactions()
        assert row["state"] == "precommitted" and row["checkpoint_id"] == 1
        assert row["producer_epoch"] is not None and writer.oldest_transaction_age() == 8.5
        await writer.commit(1)
        assert writer.transactions() == [] and writer.oldest_transaction_age() == 0
    finally:
        await writer.close()


@pytest.fixture
async def kafka_daemon(kafka_broker, new_topic, tmp_path: Path) -> AsyncIterator[Any]:
    topic = await new_topic(2)
    config = JobConfig(checkpoint=CheckpointConfig(directory=tmp_path / "ckpt", interval=0.2))
    env = StreamEnvironment("txn-view", config=config)
    counts = (
        env.from_source(GeneratorSource(None, keys=20, rate=2000), uid="events")
        .key_by(app_id)
        .process(CountPageViews(), uid="pv-count")
    )
    counts.sink_to(KafkaSink(topic, kafka_broker.bootstrap_servers), uid="pv-sink")
    daemon = JobDaemon(env.spec(), DaemonSettings(rest_enabled=False))
    job = asyncio.create_task(daemon.run())
    client: TestClient[Any, Any] = TestClient(TestServer(build_app(daemon, None)))
    await client.start_server()
    try:
        await wait_until(lambda: daemon.runner.run_state.last_checkpoint() is not None, limit=60)
        yield client
    finally:
        await client.close()
        daemon.runner.cancel()
        await asyncio.gather(job, return_exceptions=True)


async def test_rest_lists_the_jobs_transactions_and_metrics_export_their_age(kafka_daemon):
    resp = await kafka_daemon.get("/transactions")
    assert resp.status == 200
    rows = (await resp.json())["transactions"]
    assert rows, "a running Kafka sink has an open transaction"
    for row in rows:
        assert row["sink"] == "pv-sink" and row["task"].endswith("-0")
        assert row["transactional_id"].startswith("txn-view-pv-sink-0-")
        assert row["state"] in ("open", "precommitted") and row["timeout_seconds"] == 3600
    assert (await kafka_daemon.post("/transactions")).status in (401, 405)  # read-only
    metrics = await (await kafka_daemon.get("/metrics")).text()
    lines = [ln for ln in metrics.splitlines() if ln.startswith("aiostream_sink_oldest")]
    assert lines and float(lines[0].split()[-1]) >= 0, lines


def txn_cli(action: str, ckpt: Path, bootstrap: str, *extra: str) -> Any:
    return cli(
        "transactions", action, *extra, "--checkpoint-dir", str(ckpt), "--bootstrap", bootstrap
    )


async def test_cli_lists_and_repairs_what_a_crash_left(
    kafka_broker, new_topic, read_topic, tmp_path
):
    """A job dies at commit(2): its pre-committed transaction blocks read_committed readers.

    ``transactions list`` shows it with its checkpoint; ``abort`` refuses it
    and ``commit`` refuses what no checkpoint pre-committed (recovery's
    rules); ``commit`` then settles it, after which no reader is held back and
    the restarted job still ends exactly once.
    """
    bootstrap = kafka_broker.bootstrap_servers
    events = tmp_path / "events.jsonl"
    write_generated_jsonl(events, 200_000, seed=9, keys=100)
    in_topic, out_topic = await new_topic(2, prefix="in"), await new_topic(2, prefix="out")
    assert await load_jsonl(bootstrap, in_topic, events) == 200_000
    ckpt = tmp_path / "ckpt"
    sets = {
        "checkpoint.dir": ckpt, "checkpoint.interval": "100ms", "rest.enabled": "false",
        "app.kafka_bootstrap": bootstrap, "app.input_topic": in_topic,
        "app.output_topic": out_topic, "app.stop_at_end": "1",
        "app.crash_at_commit": "2", "app.crash_marker": tmp_path / "crashed",
    }  # fmt: skip
    cmd = cli_cmd(
        "run", str(CRASH_APP), *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    )
    first = await asyncio.to_thread(
        subprocess.run, cmd, capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert first.returncode == 137, first.stderr[-3000:]

    listed = txn_cli("list", ckpt, bootstrap, "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    rows = json.loads(listed.stdout)
    (pending,) = [r for r in rows if r["recovery"] == "commit"]
    assert pending["checkpoint"] == 2 and pending["state"] == "Ongoing", rows
    assert pending["age_seconds"] is not None and pending["age_seconds"] >= 0
    table = txn_cli("list", ckpt, bootstrap)
    assert pending["transactional_id"] in table.stdout and "commit" in table.stdout

    refused = txn_cli("abort", ckpt, bootstrap, pending["transactional_id"])
    assert refused.returncode == 2 and "commit it instead" in refused.stderr, refused.stderr
    other = next(r["transactional_id"] for r in rows if r is not pending)
    refused = txn_cli("commit", ckpt, bootstrap, other)
    assert refused.returncode == 2 and "not pre-committed" in refused.stderr, refused.stderr
    refused = txn_cli("abort", ckpt, bootstrap, "someone-elses-0-0")
    assert refused.returncode == 2 and "not one of this job's" in refused.stderr

    before = len(await read_topic(out_topic))
    done = txn_cli("commit", ckpt, bootstrap, pending["transactional_id"])
    assert done.returncode == 0, done.stderr[-2000:]
    for row in rows:
        if row["recovery"] == "abort":
            assert txn_cli("abort", ckpt, bootstrap, row["transactional_id"]).returncode == 0
    assert len(await read_topic(out_topic)) > before
    await stable_equals_high_watermark(bootstrap, out_topic, 2)
    rows = json.loads(txn_cli("list", ckpt, bootstrap, "--json").stdout)
    assert [r for r in rows if r["recovery"] != "none"] == [], rows

    second = await asyncio.to_thread(
        subprocess.run, cmd, capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert second.returncode == 0, second.stderr[-3000:]
    values = await read_topic(out_topic, timeout_s=60)
    expected, _ = recount_inputs([events])
    verdict = check_pv_updates(map(orjson.loads, values), expected)
    assert verdict.passed, verdict.problems[:10]
