"""Kafka output: read_committed skips an aborted transaction, read_uncommitted sees it."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from aiostream_ckpt_dev.broker import KafkaBroker
from aiostream_ckpt_dev.validate import get_spark, pv_count_check, read_kafka_output

from .conftest import build_case

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]


async def test_aborted_transaction_is_invisible_only_to_read_committed(
    spark: Any,
    kafka_broker: KafkaBroker,
    new_topic: Callable[..., Awaitable[str]],
    tmp_path: Path,
) -> None:
    spark = get_spark(kafka=True)  # the session fixture's, unless it started without Kafka
    case = build_case(tmp_path, n_events=2000)
    records = [r for name in sorted(case.files) for r in case.files[name]]
    n_app1 = sum(1 for app, _, _ in case.events if app == "app-1")
    topic = await new_topic(partitions=3)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_broker.bootstrap_servers,
        transactional_id=f"validate-{uuid.uuid4().hex[:8]}",
        enable_idempotence=True,
    )
    await producer.start()
    try:
        half = len(records) // 2
        sent = {}
        async with producer.transaction():
            for r in records[:half]:
                fut = await producer.send(topic, orjson.dumps(r), key=r["app_id"].encode())
                sent[(r["app_id"], r["pv"])] = fut
        first = sent[("app-1", 1)].result()
        # A zombie's transaction: a replayed update and one past the end, aborted.
        await producer.begin_transaction()
        replay = await producer.send_and_wait(
            topic, orjson.dumps({"app_id": "app-1", "pv": 1}), key=b"app-1"
        )
        extra = await producer.send_and_wait(
            topic, orjson.dumps({"app_id": "app-1", "pv": n_app1 + 1}), key=b"app-1"
        )
        await producer.abort_transaction()
        async with producer.transaction():
            for r in records[half:]:
                await producer.send(topic, orjson.dumps(r), key=r["app_id"].encode())
    finally:
        await producer.stop()
    bootstrap = kafka_broker.bootstrap_servers

    committed = pv_count_check(spark, case.input_paths, read_kafka_output(spark, bootstrap, topic))
    assert committed.passed, committed.to_json()
    assert committed.counts["records_out"] == len(records)

    dirty = pv_count_check(
        spark,
        case.input_paths,
        read_kafka_output(spark, bootstrap, topic, isolation="read_uncommitted"),
    )
    assert not dirty.passed
    assert dirty.counts["records_out"] == len(records) + 2
    assert dirty.examples["duplicates"] == [
        {
            "key": "app-1",
            "pv": 1,
            "at": f"{topic}/{replay.partition}@{replay.offset}",
            "earlier_at": f"{topic}/{first.partition}@{first.offset}",
        }
    ]
    [unexpected] = dirty.examples["unexpected"]
    assert unexpected == {
        "key": "app-1",
        "pv": n_app1 + 1,
        "expected": n_app1,
        "at": f"{topic}/{extra.partition}@{extra.offset}",
    }
