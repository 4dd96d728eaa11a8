"""Keys that cross shards: a repartition topic between two keyed stages, exactly-once.

``apps/app_user_counts.py`` numbers each event per app (the input topic's
partitioning), then goes ``through`` a topic partitioned by user and
numbers it per user. Run as one daemon, and as two shards of which one is
killed with SIGKILL right after a checkpoint and started again: ``read_committed``,
every event is in the output exactly once, each app's and each user's
numbers exactly ``1..n``.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt.connectors.generator import write_generated_jsonl
from aiostream_ckpt_dev.demo.kafka import load_jsonl
from apps.app_user_counts import app_id, check_output
from tests.helpers import REPO, DaemonProcess, cli_cmd, newest_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

EVENTS = 60_000


async def _topics(
    kafka_broker: Any, new_topic: Any, tmp_path: Path, partitions: int
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    bootstrap = kafka_broker.bootstrap_servers
    names = {
        "input_topic": await new_topic(partitions, prefix="in"),
        "through_topic": await new_topic(partitions, prefix="by-user"),
        "output_topic": await new_topic(2, prefix="out"),
    }
    path = tmp_path / "events.jsonl"
    write_generated_jsonl(path, EVENTS, seed=21, keys=200)
    assert await load_jsonl(bootstrap, names["input_topic"], path, key_grouped=app_id) == EVENTS
    events = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return {"kafka_bootstrap": bootstrap, **names}, events


def _args(tmp_path: Path, params: dict[str, str], *extra: str) -> list[str]:
    sets = {
        "job.name": "app-user-counts",
        "checkpoint.dir": str(tmp_path / "ckpt"),
        "checkpoint.interval": "100ms",
        "job.batch_size": "512",
        "rest.enabled": "false",
        "restart.strategy": "none",
        "app.stop_at_end": "1",
        **{f"app.{k}": v for k, v in params.items()},
    }
    flags = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return ["run", "apps.app_user_counts", *flags, *extra]


async def _wait_for_output(read_topic: Any, topic: str, n: int, *, limit: float = 240) -> None:
    """Poll the committed output until it holds ``n`` records (the job itself never ends)."""
    deadline = time.monotonic() + limit
    while len(await read_topic(topic, timeout_s=60)) < n:
        assert time.monotonic() < deadline, f"fewer than {n} records in {topic} after {limit}s"
        await asyncio.sleep(1)


def _stop(*daemons: DaemonProcess) -> None:
    for d in daemons:
        d.proc.send_signal(signal.SIGTERM)
    for d in daemons:
        assert d.wait(120) == 0, d.stderr[-3000:]


async def test_one_daemon_counts_by_app_then_by_user_exactly_once(
    kafka_broker: Any, new_topic: Any, read_topic: Any, tmp_path: Path
) -> None:
    params, events = await _topics(kafka_broker, new_topic, tmp_path, partitions=2)
    with DaemonProcess(*_args(tmp_path, params)) as daemon:
        await _wait_for_output(read_topic, params["output_topic"], EVENTS)
        await asyncio.to_thread(_stop, daemon)
    values = await read_topic(params["output_topic"], timeout_s=60)
    assert check_output(map(orjson.loads, values), events) == []


async def test_two_shards_through_a_repartition_topic_under_kill9(
    kafka_broker: Any, new_topic: Any, read_topic: Any, tmp_path: Path
) -> None:
    params, events = await _topics(kafka_broker, new_topic, tmp_path, partitions=2)
    kill = {"AIOSTREAM_FAILPOINTS": "metadata_durable=kill@3"}
    shard0 = DaemonProcess(*_args(tmp_path, params, "--shard", "0/2"))
    shard1 = DaemonProcess(*_args(tmp_path, params, "--shard", "1/2"), env=kill)
    with shard0, shard1:
        assert await asyncio.to_thread(shard1.wait, 180) == -9, shard1.stderr[-3000:]
        restored = newest_checkpoint(tmp_path / "ckpt" / "shard-1-of-2")
        with DaemonProcess(*_args(tmp_path, params, "--shard", "1/2")) as again:
            await asyncio.to_thread(again.wait_for, f"restoring from checkpoint {restored} (")
            await _wait_for_output(read_topic, params["output_topic"], EVENTS)
            await asyncio.to_thread(_stop, shard0, again)
    # each shard reads its partition of the input and of the repartition topic only
    for j, log in ((0, shard0.stderr), (1, again.stderr)):
        for topic in (params["input_topic"], params["through_topic"]):
            assert f"reading {topic}:{j}@" in log and f"{topic}:{1 - j}@" not in log, log[-3000:]
        assert f"app-user-counts-by-user-write-{j}-0.." in log  # its own transactional ids
    values = await read_topic(params["output_topic"], timeout_s=60)
    assert check_output(map(orjson.loads, values), events) == []
    # nothing more comes: the counts are final (no record repeated after the stop)
    assert len(values) == EVENTS


def test_the_app_refuses_missing_topics(tmp_path: Path) -> None:
    done = subprocess.run(
        cli_cmd("run", "apps.app_user_counts", "--set", f"checkpoint.dir={tmp_path}"),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 2 and "set app.kafka_bootstrap" in done.stderr, done.stderr
