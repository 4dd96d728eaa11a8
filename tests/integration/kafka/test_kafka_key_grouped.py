"""Kafka co-partitioning: a topic written by key group is counted without a shuffle.

The sink's ``KeyGroupPartitioner`` puts partition j of N's key groups (those
subtask j of N owns) in partition j; ``KafkaSource(key_grouped=True)`` hands
each partition to the subtask owning them, so ``reinterpret_as_keyed`` counts
right at parallelism 2. A topic keyed the usual way (murmur2 of the record
key) is not laid out so: reading it as key-grouped fails naming the key.
"""

from __future__ import annotations

import collections
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.kafka.sink import KafkaSink
from aiostream_ckpt.connectors.kafka.source import KafkaSource
from aiostream_ckpt.connectors.key_grouped import KeyGroupPartitioner
from aiostream_ckpt.errors import JobFailedError
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.keygroups import KeyGroupRange, key_group_of
from aiostream_ckpt.testing import run_job_async
from apps import pv_count
from apps.pv_count import CountPageViews, app_id
from tests.helpers import stable_equals_high_watermark

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

EVENTS = [{"app_id": f"app-{(i * 31) % 41}", "seq": i} for i in range(3_000)]


async def _write(topic: str, bootstrap: str, **sink: Any) -> None:
    env = StreamEnvironment("writer", config=JobConfig(batch_size=200))
    out = KafkaSink(topic, bootstrap, semantic="at_least_once", **sink)
    env.from_collection(EVENTS).sink_to(out, uid="out")
    await run_job_async(env, {})


async def _partitions(bootstrap: str, topic: str, n: int) -> dict[int, list[Any]]:
    """Each partition's committed records (``read_committed``, up to the end offsets).

    Once every partition has its commit markers: see :func:`stable_equals_high_watermark`.
    """
    await stable_equals_high_watermark(bootstrap, topic, n)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed"
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(n)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        got: dict[int, list[Any]] = {p: [] for p in range(n)}
        while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                got[tp.partition].extend(orjson.loads(r.value) for r in records)
        return got
    finally:
        await consumer.stop()


def _reader_job(topic: str, bootstrap: str) -> tuple[StreamEnvironment, Any]:
    env = StreamEnvironment("reader", config=JobConfig(parallelism=2, batch_size=200))
    source = KafkaSource(topic, bootstrap, stop_at_end=True, key_grouped=True)
    events = env.from_source(source, uid="events")
    return env, events.reinterpret_as_keyed(app_id).process(CountPageViews(), uid="pv-count")


async def test_a_topic_written_by_key_group_is_counted_without_a_shuffle(
    kafka_broker: Any, new_topic: Any
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = await new_topic(4)
    await _write(topic, bootstrap, partitioner=KeyGroupPartitioner(app_id), key_fn=app_id)
    for j, records in (await _partitions(bootstrap, topic, 4)).items():
        own = KeyGroupRange.for_operator(j, 4, 128)
        assert records and all(key_group_of(r["app_id"], 128) in own for r in records)

    env, counts = _reader_job(topic, bootstrap)
    out = await run_job_async(env, {"counts": counts})
    final: dict[str, int] = collections.defaultdict(int)
    for rec in out["counts"]:
        final[rec["app_id"]] = max(final[rec["app_id"]], rec["pv"])
    assert final == collections.Counter(e["app_id"] for e in EVENTS)
    assert len(out["counts"]) == len(EVENTS)


async def test_a_topic_keyed_by_murmur2_is_refused_as_key_grouped(
    kafka_broker: Any, new_topic: Any
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = await new_topic(4)
    await _write(topic, bootstrap, key_fn=app_id)  # Kafka's default partitioner
    env, counts = _reader_job(topic, bootstrap)
    with pytest.raises(JobFailedError) as info:
        await run_job_async(env, {"counts": counts})
    text = str(info.value)
    assert "PartitioningError" in text and "not retriable" in text, text
    assert "key 'app-" in text and "key group" in text and f"{topic}:" in text, text


async def test_pv_count_kafka_mode_key_grouped_reads_and_writes_by_key_group(
    kafka_broker: Any, new_topic: Any
) -> None:
    """``app.key_grouped=1``: exactly-once counts, and the output topic laid out by key group."""
    bootstrap = kafka_broker.bootstrap_servers
    source, output = await new_topic(4), await new_topic(2)
    await _write(source, bootstrap, partitioner=KeyGroupPartitioner(app_id))
    params = {
        "kafka_bootstrap": bootstrap,
        "input_topic": source,
        "output_topic": output,
        "stop_at_end": "1",
        "key_grouped": "1",
    }
    config = JobConfig(parallelism=2, batch_size=200)
    env = StreamEnvironment(f"pv-{output}", config=config, params=params)
    pv_count.build(env)
    await run_job_async(env, {})
    final: dict[str, int] = collections.defaultdict(int)
    for j, records in (await _partitions(bootstrap, output, 2)).items():
        own = KeyGroupRange.for_operator(j, 2, 128)
        assert records and all(key_group_of(r["app_id"], 128) in own for r in records)
        for r in records:
            assert r["pv"] == final[r["app_id"]] + 1  # a key's updates in order, once each
            final[r["app_id"]] = r["pv"]
    assert final == collections.Counter(e["app_id"] for e in EVENTS)
