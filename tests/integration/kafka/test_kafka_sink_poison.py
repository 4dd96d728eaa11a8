"""The Kafka sink's serializer fails on some records: dead letters and output exactly once.

``errors.on_process_error=dead_letter`` under kill -9: every record the
serializer raises on is dead-lettered once (in the checkpoint that covers it,
like the transaction it was left out of), and read_committed consumers see
every other update exactly once. ``fail``: the job exits 1 naming the
serializer, the sink and the record, and leaves no transaction open on the
broker (the open one is aborted; what consumers see are whole checkpoints).
Before, the serializer's error failed the job whatever the policy, without
naming the function or the record.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from aiostream_ckpt_dev.recount import check_pv_updates
from tests.apps.poison_places import POISON_APP
from tests.helpers import (
    cli,
    recount,
    run_app_under_kills,
    stable_equals_high_watermark,
    topic_end_offsets,
)
from tests.integration.runtime.test_process_error_places import poisoned
from tests.integration.runtime.test_process_errors import process_dead_letters

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

APP = "tests.apps.poison_places"

PARTITIONS = 2


def settings(bootstrap: str, topic: str, events: Path, *extra: str) -> list[str]:
    """The ``--set`` lines of the poison app writing to ``topic``."""
    return [
        f"job.name=poison-{topic}",
        "checkpoint.interval=100ms",
        "app.poison_in=sink_serializer",
        f"app.input={events}",
        f"app.kafka_bootstrap={bootstrap}",
        f"app.output_topic={topic}",
        *extra,
    ]


async def test_unserializable_records_are_dead_lettered_once_under_kill9(
    kafka_broker, new_topic, read_topic, tmp_path
):
    events = tmp_path / "in.jsonl"
    added = poisoned(events, 15_000, 10, seed=3)
    topic = await new_topic(PARTITIONS, prefix="poison")
    # Paced: a pass takes >= 3 s, 30 checkpoint intervals, on any machine. Unpaced, an
    # idle one read all 15 k events before its first checkpoint completed (0 kills).
    lines = settings(
        kafka_broker.bootstrap_servers,
        topic,
        events,
        "errors.on_process_error=dead_letter",
        "app.rate=5000",
    )
    await asyncio.to_thread(
        run_app_under_kills,
        tmp_path, APP, lines, kills=2, seed=4, inputs=[events], batch_size=256,
        max_delay_after_checkpoint=0.3, timeout=240,
    )  # fmt: skip
    expected = recount(events)
    del expected[POISON_APP]
    values = await read_topic(topic, timeout_s=60)
    verdict = check_pv_updates(map(orjson.loads, values), expected)
    assert verdict.passed, verdict.problems[:10]
    dead = process_dead_letters(tmp_path / "ckpt" / "dead-letter")
    assert sorted(orjson.loads(d["raw"])["pv"] for d in dead) == list(range(1, len(added) + 1))
    for d in dead:
        assert d["origin"]["operator"] == "pv-sink", d
        assert d["origin"]["function"] == "serializer poison_dumps", d
        assert d["reason"].startswith("process error: ValueError: poison output"), d
    await stable_equals_high_watermark(kafka_broker.bootstrap_servers, topic, PARTITIONS)


async def test_unserializable_record_fails_the_job_naming_it(
    kafka_broker, new_topic, read_topic, tmp_path
):
    events = tmp_path / "in.jsonl"
    poisoned(events, 5_000, 1, seed=5)
    topic = await new_topic(PARTITIONS, prefix="poison")
    # no checkpoint before the failure: its transaction is the open one, with records in it
    lines = [
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "job.batch_size=256",
        *settings(kafka_broker.bootstrap_servers, topic, events),
        "restart.strategy=none",
        "checkpoint.interval=1h",
    ]
    r = await asyncio.to_thread(cli, "run", APP, *(a for line in lines for a in ("--set", line)))
    assert r.returncode == 1, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert (
        "serializer poison_dumps of operator 'pv-sink' failed on record "
        "{'app_id': 'app-poison', 'pv': 1}" in last
    ), last
    assert "ValueError: poison output 1" in last, last
    # nothing half-written: the transaction with the records before it was aborted
    ends = await topic_end_offsets(kafka_broker.bootstrap_servers, topic, PARTITIONS)
    assert sum(ends["read_uncommitted"].values()) > 0, "the job failed before it wrote anything"
    await stable_equals_high_watermark(kafka_broker.bootstrap_servers, topic, PARTITIONS)
    assert await read_topic(topic, timeout_s=60) == []
