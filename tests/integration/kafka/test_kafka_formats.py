"""Registry formats against the real broker: a source dead-letters what does not decode,
a job reads Avro and writes Avro exactly-once, and Confluent's client reads what it wrote.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.kafka.formats import AvroFormat, SchemaRegistry
from aiostream_ckpt.connectors.kafka.sink import KafkaSink
from aiostream_ckpt.connectors.kafka.source import KafkaSource
from aiostream_ckpt.errors import ConnectorError
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.testing import run_job_async
from aiostream_ckpt_dev.schema_registry import SchemaRegistryStandIn
from tests.helpers import stable_equals_high_watermark
from tests.schema_helpers import PV_V1, PV_V2

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

KEY_SCHEMA = '"string"'


@pytest.fixture
def stand_in():
    with SchemaRegistryStandIn() as server:
        yield server


async def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, value in records:
            await producer.send(topic, value, key=key, partition=0)
        await producer.flush()
    finally:
        await producer.stop()


async def encoded(
    url: str, schema: Any, topic: str, records: list[Any], *, is_key=False
) -> list[bytes]:
    fmt = AvroFormat(SchemaRegistry(url), schema)
    async with fmt.registry.client() as client:
        encode = await fmt.encoder(client, topic, is_key=is_key)
    return [encode(r) for r in records]


async def committed_records(bootstrap: str, topic: str, n: int) -> list[tuple[bytes, bytes]]:
    """Every committed (key, value) of the topic, read_committed up to its end offsets."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed"
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(n)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        out: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + 30
        while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
            assert time.monotonic() < deadline, "output not read in 30 s"
            for records in (await consumer.getmany(timeout_ms=500)).values():
                out += [(r.key, r.value) for r in records]
        return out
    finally:
        await consumer.stop()


async def read_all(reader: Any) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        batch = await reader.read_batch(100)
        if batch is None:
            return out
        out.extend(batch)
    raise AssertionError("bounded reader did not end")


async def test_source_decodes_evolved_records_and_dead_letters_the_rest(
    kafka_broker, new_topic, stand_in
):
    bootstrap = kafka_broker.bootstrap_servers
    topic = await new_topic(1)
    v1 = await encoded(stand_in.url, PV_V1, topic, [{"app_id": "a", "n": 1}])
    v2 = await encoded(stand_in.url, PV_V2, topic, [{"app_id": "b", "n": 2, "region": "us"}])
    keys = await encoded(stand_in.url, KEY_SCHEMA, topic, ["ka", "kb"], is_key=True)
    unknown_id = b"\x00\x00\x00\x03\xe7" + v1[0][5:]
    await produce(
        bootstrap,
        topic,
        [
            (keys[0], v1[0]),  # offset 0
            (None, b'{"app_id": "json"}'),  # 1: not framed
            (keys[1], unknown_id),  # 2: an id the registry lacks
            (keys[1], v2[0]),  # 3
            (keys[0], v1[0][:-1]),  # 4: truncated
        ],
    )
    dead: list[Any] = []
    context = ConnectorContext("job", "src", 0, 1)
    context.dead_letter = lambda raw, reason, origin: dead.append((raw, reason, origin))
    registry = SchemaRegistry(stand_in.url)
    source = KafkaSource(
        topic,
        bootstrap,
        stop_at_end=True,
        value_format=AvroFormat(registry, PV_V2),
        key_format=AvroFormat(registry, KEY_SCHEMA),
    )
    assert not source.json_exact
    reader = source.create_reader(context)
    await reader.start(None)
    try:
        got = await read_all(reader)
    finally:
        await reader.close()
    assert got == [
        ("ka", {"app_id": "a", "n": 1, "region": "eu"}),
        ("kb", {"app_id": "b", "n": 2, "region": "us"}),
    ]
    reasons = {origin["offset"]: (raw, reason) for raw, reason, origin in dead}
    assert set(reasons) == {1, 2, 4}
    assert all(o["topic"] == topic and o["partition"] == 0 for _, _, o in dead)
    assert reasons[1][0] == b'{"app_id": "json"}'
    assert "not in the Confluent wire format (magic byte 123" in reasons[1][1]
    assert "schema id 999 is not in the schema registry" in reasons[2][1]
    assert reasons[4][1].startswith("cannot deserialize: EOFError")
    # the registry was asked once per schema id, not per record
    ids = [p for m, p in stand_in.state.requests if p.startswith("/schemas/ids/")]
    assert sorted(ids) == sorted(set(ids))


async def test_registry_down_fails_the_source_not_the_records(kafka_broker, new_topic, stand_in):
    bootstrap = kafka_broker.bootstrap_servers
    topic = await new_topic(1)
    (raw,) = await encoded(stand_in.url, PV_V1, topic, [{"app_id": "a", "n": 1}])
    await produce(bootstrap, topic, [(None, raw)])
    stand_in.fail_next(10, 503)
    registry = SchemaRegistry(stand_in.url, retries=2, backoff_s=0.01)
    source = KafkaSource(topic, bootstrap, stop_at_end=True, value_format=AvroFormat(registry))
    dead: list[Any] = []
    context = ConnectorContext("job", "src", 0, 1)
    context.dead_letter = lambda *a: dead.append(a)
    reader = source.create_reader(context)
    await reader.start(None)
    try:
        with pytest.raises(ConnectorError, match="failed after 3 attempts: HTTP 503") as exc:
            await read_all(reader)
    finally:
        await reader.close()
    assert exc.value.retriable and dead == []


async def test_job_reads_and_writes_avro_exactly_once_and_confluent_reads_it(
    kafka_broker, new_topic, stand_in
):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    bootstrap = kafka_broker.bootstrap_servers
    src_topic, out_topic = await new_topic(2), await new_topic(2)
    events = [{"app_id": f"app-{i % 7}", "n": i} for i in range(500)]
    raws = await encoded(stand_in.url, PV_V1, src_topic, events)
    await produce(bootstrap, src_topic, [(None, r) for r in raws])
    registry = SchemaRegistry(stand_in.url)
    out_schema = {
        "type": "record",
        "name": "Doubled",
        "fields": [{"name": "app_id", "type": "string"}, {"name": "twice", "type": "long"}],
    }
    env = StreamEnvironment("avro-job", config=JobConfig(batch_size=64))
    (
        env.from_source(
            KafkaSource(src_topic, bootstrap, stop_at_end=True, value_format=AvroFormat(registry)),
            uid="in",
        )
        .map(lambda e: {"app_id": e["app_id"], "twice": 2 * e["n"]})
        .sink_to(
            KafkaSink(
                out_topic,
                bootstrap,
                key_fn=lambda r: r["app_id"],
                value_format=AvroFormat(registry, out_schema),
                key_format=AvroFormat(registry, KEY_SCHEMA),
                transactional_id_prefix=f"avro-{out_topic}",
            ),
            uid="out",
        )
    )
    await run_job_async(env, {}, checkpoint_interval=0.2)
    await stable_equals_high_watermark(bootstrap, out_topic, 2)
    assert set(stand_in.state.subjects) >= {f"{out_topic}-value", f"{out_topic}-key"}

    records = await committed_records(bootstrap, out_topic, 2)
    theirs = AvroDeserializer(SchemaRegistryClient({"url": stand_in.url}))
    ctx = SerializationContext(out_topic, MessageField.VALUE)
    key_ctx = SerializationContext(out_topic, MessageField.KEY)
    got = [(theirs(k, key_ctx), theirs(v, ctx)) for k, v in records]
    assert sorted(got, key=lambda kv: kv[1]["twice"]) == [
        (e["app_id"], {"app_id": e["app_id"], "twice": 2 * e["n"]}) for e in events
    ]
