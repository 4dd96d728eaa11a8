"""The Kafka source against the real broker: splits, positions, starting points, errors."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord

from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.kafka.source import KafkaSource
from aiostream_ckpt.errors import ConfigError, ConnectorError
from aiostream_ckpt_dev.broker.process import free_port

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def ctx(subtask: int = 0, parallelism: int = 1, dead: list | None = None) -> ConnectorContext:
    c = ConnectorContext("job", "src", subtask, parallelism)
    if dead is not None:
        c.dead_letter = lambda raw, reason, origin: dead.append((raw, reason, origin))
    return c


async def produce(bootstrap: str, topic: str, values_by_partition: dict[int, list[bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for p, values in values_by_partition.items():
            for v in values:
                await producer.send(topic, v, partition=p)
        await producer.flush()
    finally:
        await producer.stop()


def ev(p: int, i: int) -> bytes:
    return orjson.dumps({"p": p, "i": i})


async def read_all(reader: Any, limit: int = 1000, max_records: int = 7) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + 20
    while len(out) < limit and time.monotonic() < deadline:
        batch = await reader.read_batch(max_records)
        if batch is None:
            break
        out.extend(batch)
    return out


async def test_partitions_split_over_subtasks_and_resume_from_positions(kafka_broker, new_topic):
    bootstrap = kafka_broker.bootstrap_servers
    topic = await new_topic(4)
    await produce(bootstrap, topic, {p: [ev(p, i) for i in range(10)] for p in range(4)})
    src = KafkaSource(topic, bootstrap, stop_at_end=True)
    readers = [src.create_reader(ctx(s, 2)) for s in range(2)]
    first: list[Any] = []
    positions: dict[str, int] = {}
    for r in readers:
        await r.start(None)
        first += await read_all(r, limit=9)
        positions.update(r.snapshot_position())
        await r.close()
    assert [rd.partitions for rd in readers] == [[(topic, 0), (topic, 2)], [(topic, 1), (topic, 3)]]
    assert sum(positions.values()) == len(first)
    # Restart at another parallelism from the union of positions: exactly the rest.
    rest: list[Any] = []
    for s in range(3):
        r = src.create_reader(ctx(s, 3))
        await r.start(positions)
        rest += await read_all(r)
        assert await r.read_batch(10) is None  # bounded: done
        await r.close()
    seen = sorted((e["p"], e["i"]) for e in first + rest)
    assert seen == [(p, i) for p in range(4) for i in range(10)]


async def test_starting_latest_and_timestamp(kafka_broker, new_topic):
    bootstrap = kafka_broker.bootstrap_servers
    topic = await new_topic(1)
    await produce(bootstrap, topic, {0: [ev(0, i) for i in range(5)]})
    await asyncio.sleep(0.02)
    cut = int(time.time() * 1000)
    await asyncio.sleep(0.02)
    await produce(bootstrap, topic, {0: [ev(0, i) for i in range(5, 8)]})

    latest = KafkaSource(topic, bootstrap, starting="latest").create_reader(ctx())
    await latest.start(None)
    assert latest.snapshot_position() == {f"{topic}:0": 8}
    await produce(bootstrap, topic, {0: [ev(0, 8)]})
    assert [e["i"] for e in await read_all(latest, limit=1)] == [8]
    await latest.close()

    by_ts = KafkaSource(topic, bootstrap, starting={"timestamp": cut}, stop_at_end=True)
    r = by_ts.create_reader(ctx())
    await r.start(None)
    assert [e["i"] for e in await read_all(r)] == [5, 6, 7, 8]
    await r.close()


async def test_stop_at_end_stops_at_the_last_stable_offset(kafka_broker, new_topic):
    """An open transaction holds the end back (read_committed); its records never show."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = await new_topic(1)
    await produce(bootstrap, topic, {0: [ev(0, 0), ev(0, 1)]})
    txn = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=uuid.uuid4().hex)
    await txn.start()
    try:
        await txn.begin_transaction()
        await txn.send_and_wait(topic, ev(0, 99), partition=0)
        await produce(bootstrap, topic, {0: [ev(0, 2)]})  # after the open txn: beyond the LSO
        r = KafkaSource(topic, bootstrap, stop_at_end=True).create_reader(ctx())
        await r.start(None)
        assert [e["i"] for e in await read_all(r)] == [0, 1]
        assert r.snapshot_position() == {f"{topic}:0": 2}
        await r.close()
    finally:
        await txn.abort_transaction()
        await txn.stop()
    # After the abort the marker and aborted record are skipped: 0, 1, 2 and done.
    r = KafkaSource(topic, bootstrap, stop_at_end=True).create_reader(ctx())
    await r.start(None)
    assert [e["i"] for e in await read_all(r)] == [0, 1, 2]
    assert r.snapshot_position() == {f"{topic}:0": 5}  # 0,1,aborted,2,abort marker
    await r.close()


async def test_undeserializable_records_go_to_dead_letter_with_their_origin(
    kafka_broker, new_topic
):
    bootstrap = kafka_broker.bootstrap_servers
    topic = await new_topic(2)
    await produce(bootstrap, topic, {0: [ev(0, 0), b"{not json", ev(0, 2)], 1: [ev(1, 0)]})
    dead: list = []
    r = KafkaSource(topic, bootstrap, stop_at_end=True).create_reader(ctx(dead=dead))
    await r.start(None)
    got = await read_all(r, max_records=100)
    await r.close()
    assert sorted((e["p"], e["i"]) for e in got) == [(0, 0), (0, 2), (1, 0)]
    assert len(dead) == 1
    raw, reason, origin = dead[0]
    assert raw == b"{not json"
    assert "deserialize" in reason
    assert origin == {"topic": topic, "partition": 0, "offset": 1}
    assert r.snapshot_position() == {f"{topic}:0": 3, f"{topic}:1": 1}


async def test_offsets_committed_to_kafka_only_after_checkpoint_complete(kafka_broker, new_topic):
    bootstrap = kafka_broker.bootstrap_servers
    topic = await new_topic(1)
    await produce(bootstrap, topic, {0: [ev(0, i) for i in range(6)]})
    group = f"g-{uuid.uuid4().hex[:8]}"
    src = KafkaSource(topic, bootstrap, commit_offsets_to_kafka=True, group_id=group)
    assert src.commits_offsets
    r = src.create_reader(ctx())
    await r.start(None)
    await read_all(r, limit=4, max_records=4)
    assert r.snapshot_position_for(1) == {f"{topic}:0": 4}
    await read_all(r, limit=1, max_records=1)
    assert r.snapshot_position_for(2) == {f"{topic}:0": 5}  # a checkpoint that aborts
    await read_all(r, limit=1, max_records=1)
    assert r.snapshot_position_for(3) == {f"{topic}:0": 6}

    async def committed() -> int | None:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
        await c.start()
        try:
            return await c.committed(TopicPartition(topic, 0))
        finally:
            await c.stop()

    assert await committed() is None
    await r.notify_checkpoint_complete(1)
    assert await committed() == 4  # checkpoint 1's offset, not the reader's current one
    await r.notify_checkpoint_complete(3)
    assert await committed() == 6  # 3's: aborted 2 is not committed in between, nor after
    await r.notify_checkpoint_complete(3)
    assert await committed() == 6
    await r.close()


async def test_missing_topic_and_unreachable_broker_fail_fast(kafka_broker):
    r = KafkaSource("no-such-topic-x", kafka_broker.bootstrap_servers).create_reader(ctx())
    with pytest.raises(ConnectorError, match="does not exist") as info:
        await r.start(None)
    await r.close()
    assert "\n" not in str(info.value)

    dead = f"127.0.0.1:{free_port()}"
    r = KafkaSource("t", dead, connect_timeout_s=1.5).create_reader(ctx())
    started = time.monotonic()
    with pytest.raises(ConnectorError, match="cannot reach Kafka") as info:
        await r.start(None)
    await r.close()
    assert time.monotonic() - started < 10
    assert info.value.retriable


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="bootstrap"):
        KafkaSource("t", "localhost")
    with pytest.raises(ConfigError, match="starting"):
        KafkaSource("t", "localhost:9092", starting="middle")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="distinct"):
        KafkaSource(["a", "a"], "localhost:9092")


async def test_per_partition_watermarks(kafka_broker, new_topic):
    """The source's watermark is the minimum over its partitions (issue 7)."""
    from aiostream_ckpt.jobspec.watermarks import WatermarkStrategy
    from aiostream_ckpt.time.watermarks import SourceWatermarks

    topic = await new_topic(2)
    bootstrap = kafka_broker.bootstrap_servers

    def at(ts: int) -> bytes:
        return orjson.dumps({"ts": ts})

    await produce(bootstrap, topic, {0: [at(5000), at(6000)], 1: [at(1000)]})
    source = KafkaSource(topic, bootstrap)  # unbounded: partitions stay active
    reader = source.create_reader(ctx())
    await reader.start(None)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(0).with_timestamp_assigner(
        lambda e: e["ts"]
    )
    sw = SourceWatermarks(strategy, reader, time.monotonic)
    seen: list[Any] = []
    marks: list[int] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        batch = await sw.read_batch(100)
        if batch is None:
            break
        seen.extend(batch)
        update = sw.poll()
        if update is not None and update.watermark is not None:
            marks.append(update.watermark)
        if len(seen) == 3 and marks:
            break
    assert sorted(e["ts"] for e in seen) == [1000, 5000, 6000]
    assert marks[-1] == 999, "partition 1 (ts 1000) holds the watermark back"
    assert set(reader.active_splits()) == {f"{topic}:0", f"{topic}:1"}
    await produce(bootstrap, topic, {1: [at(7000)]})
    while time.monotonic() < deadline and marks[-1] == 999:
        await sw.read_batch(100)
        update = sw.poll()
        if update is not None and update.watermark is not None:
            marks.append(update.watermark)
    assert marks[-1] == 5999, "now partition 0 (ts 6000) is the slowest"
    await reader.close()


async def test_lean_fetch_skips_an_aborted_transaction_and_control_records(kafka_broker, new_topic):
    """The reader's lean records keep read_committed: the aborted txn and markers never show.

    Committed 0,1 (marker 2), aborted 90,91 (marker 5), committed 2,3 (marker 8).
    Another consumer in the process still gets ``ConsumerRecord`` objects.
    """
    bootstrap = kafka_broker.bootstrap_servers
    topic = await new_topic(1)
    txn = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=uuid.uuid4().hex)
    await txn.start()
    try:
        for values, commit in (([0, 1], True), ([90, 91], False), ([2, 3], True)):
            await txn.begin_transaction()
            for i in values:
                await txn.send_and_wait(topic, ev(0, i), partition=0)
            await (txn.commit_transaction() if commit else txn.abort_transaction())
    finally:
        await txn.stop()
    dead: list[Any] = []
    r = KafkaSource(topic, bootstrap, stop_at_end=True).create_reader(ctx(dead=dead))
    seen: list[Any] = []
    emit = r._emit
    r._emit = lambda tp, records, out: (seen.extend(records), emit(tp, records, out))
    await r.start(None)
    assert [e["i"] for e in await read_all(r, max_records=3)] == [0, 1, 2, 3]
    assert [rec.offset for rec in seen] == [0, 1, 6, 7]
    assert not any(isinstance(rec, ConsumerRecord) for rec in seen)  # the lean path ran
    assert dead == []
    assert r.snapshot_position() == {f"{topic}:0": 9}
    await r.close()
    plain = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", auto_offset_reset="earliest"
    )
    await plain.start()
    try:
        plain.assign([TopicPartition(topic, 0)])
        records: list[Any] = []
        deadline = time.monotonic() + 20
        while len(records) < 4 and time.monotonic() < deadline:
            got = await plain.getmany(timeout_ms=1000)
            records += [rec for batch in got.values() for rec in batch]
        assert [rec.offset for rec in records] == [0, 1, 6, 7]
        assert all(isinstance(rec, ConsumerRecord) for rec in records)
    finally:
        await plain.stop()
