"""The job's lag as operators see it: Kafka's own consumer-group tool reads the committed offsets.

A source with a ``group_id`` commits each completed checkpoint's offsets to
that group (monitoring only: the job restores from its checkpoint, never from
the group). ``kafka-consumer-groups.sh --describe`` (``ConsumerGroupCommand``
from Kafka's own jars) then shows how far the job is behind each partition.
"""

from __future__ import annotations

import uuid

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.kafka.source import KafkaSource
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.testing import run_job_async
from aiostream_ckpt_dev.broker.tools import CONSUMER_GROUPS, run_kafka_tool

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


async def produce(bootstrap: str, topic: str, per_partition: int, start: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for p in (0, 1):
            for i in range(start, start + per_partition):
                await producer.send(topic, orjson.dumps({"p": p, "i": i}), partition=p)
        await producer.flush()
    finally:
        await producer.stop()


def describe(bootstrap: str, group: str) -> dict[int, tuple[int, int, int]]:
    """``partition -> (current offset, log end offset, lag)`` as ``--describe`` prints them."""
    done = run_kafka_tool(
        CONSUMER_GROUPS, ["--bootstrap-server", bootstrap, "--describe", "--group", group]
    )
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    rows: dict[int, tuple[int, int, int]] = {}
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["GROUP"])
    columns = lines[header].split()
    for line in lines[header + 1 :]:
        cells = dict(zip(columns, line.split(), strict=False))
        if cells.get("GROUP") == group:
            rows[int(cells["PARTITION"])] = (
                int(cells["CURRENT-OFFSET"]),
                int(cells["LOG-END-OFFSET"]),
                int(cells["LAG"]),
            )
    return rows


async def test_consumer_group_tool_shows_the_jobs_lag(kafka_broker, new_topic):
    bootstrap = kafka_broker.bootstrap_servers
    topic = await new_topic(2)
    group = f"lag-{uuid.uuid4().hex[:8]}"
    await produce(bootstrap, topic, 30, 0)
    env = StreamEnvironment("lag-job", config=JobConfig(batch_size=7))
    events = env.from_source(
        KafkaSource(topic, bootstrap, group_id=group, stop_at_end=True), uid="events"
    )
    out = await run_job_async(env, {"events": events}, checkpoint_interval=0.1)
    assert len(out["events"]) == 60
    await produce(bootstrap, topic, 20, 30)  # the job has not read these: its lag
    assert describe(bootstrap, group) == {0: (30, 50, 20), 1: (30, 50, 20)}
