"""The Kafka sink's two-phase commit against the real broker, driven writer by writer.

Each test plays the runtime: recover -> write -> prepare_commit(n) -> commit(n),
and "crashes" by abandoning a writer without commit or close (its producers
stay alive: a zombie), then recovers a new writer from an older state.
"""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections import Counter

import orjson
import pytest

from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.kafka.sink import KafkaSink
from aiostream_ckpt.errors import ConfigError, ConnectorError

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def ctx(subtask: int = 0, parallelism: int = 1) -> ConnectorContext:
    return ConnectorContext("job", "sink", subtask, parallelism)


def recs(tag: str, n: int) -> list[dict[str, object]]:
    return [{"k": f"key-{i % 3}", "tag": tag, "i": i} for i in range(n)]


def tags(values: list[bytes]) -> Counter[str]:
    return Counter(orjson.loads(v)["tag"] for v in values)


async def uncommitted_tags_once(read_topic, topic: str, want: dict[str, int]) -> Counter[str]:
    """The topic's tags under read_uncommitted once they equal ``want``, or after 30 s."""
    deadline = asyncio.get_running_loop().time() + 30
    while (got := tags(await read_topic(topic, isolation_level="read_uncommitted"))) != want:
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.05)
    return got


@pytest.fixture
def sink_factory(kafka_broker):
    prefix = f"test-{uuid.uuid4().hex[:10]}"

    def make(topic: str, **kw: object) -> KafkaSink:
        kw.setdefault("transactional_id_prefix", prefix)
        return KafkaSink(topic, kafka_broker.bootstrap_servers, **kw)  # type: ignore[arg-type]

    return make


async def test_records_become_visible_only_when_their_checkpoint_commits(
    new_topic, read_topic, sink_factory
):
    topic = await new_topic(2)
    w = sink_factory(topic, key_fn=lambda r: r["k"]).create_writer(ctx())
    await w.recover(None, None)
    try:
        await w.write(recs("a", 10))
        state1 = await w.prepare_commit(1)
        await w.write(recs("b", 5))  # epoch 2, on the next slot
        assert len(state1["pending"]) == 1
        uncommitted = await read_topic(topic, isolation_level="read_uncommitted")
        # "b" is held in its open batches until they fill or its barrier flushes them
        assert tags(uncommitted) == {"a": 10}
        assert await read_topic(topic) == []
        await w.commit(1)
        assert tags(await read_topic(topic)) == {"a": 10}
        await w.prepare_commit(2)
        uncommitted = await read_topic(topic, isolation_level="read_uncommitted")
        assert tags(uncommitted) == {"a": 10, "b": 5}
        assert tags(await read_topic(topic)) == {"a": 10}
        await w.commit(2)
        await w.commit(2)  # idempotent
        assert tags(await read_topic(topic)) == {"a": 10, "b": 5}
    finally:
        await w.close()


@pytest.fixture
def batches_sent(monkeypatch):
    """Count ``send_batch`` calls: (records per submitted batch) in order."""
    from aiokafka import AIOKafkaProducer

    sent: list[int] = []
    real = AIOKafkaProducer.send_batch

    async def spy(self, batch, topic, *, partition):  # type: ignore[no-untyped-def]
        sent.append(batch.record_count())
        return await real(self, batch, topic, partition=partition)

    monkeypatch.setattr(AIOKafkaProducer, "send_batch", spy)
    return sent


async def test_exactly_once_writes_hold_batches_until_full_or_the_barrier(
    new_topic, read_topic, sink_factory, batches_sent, monkeypatch
):
    """Small writes share one batch per partition (half the CPU per record, job and
    broker); a full batch goes at once, and so do all once they hold HOLD_MAX_BYTES."""
    from aiostream_ckpt.connectors.kafka import encoder

    topic = await new_topic(1)
    w = sink_factory(topic, producer_config={"max_batch_size": 16 * 1024}).create_writer(ctx())
    await w.recover(None, None)
    try:
        for i in range(20):
            await w.write(recs(f"w{i}", 10))
        assert batches_sent == []  # 200 records of ~30 bytes: held in one open batch
        await w.prepare_commit(1)
        assert batches_sent == [200]
        await w.write(recs("big", 1000))  # ~40 KiB: full 16 KiB batches go during the write
        assert len(batches_sent) > 2 and sum(batches_sent[1:]) < 1000
        monkeypatch.setattr(encoder, "HOLD_MAX_BYTES", 100)
        await w.write(recs("capped", 5))  # past the bound: everything open is submitted
        assert sum(batches_sent[1:]) == 1005
        await w.prepare_commit(2)
        await w.commit(2)
        got = tags(await read_topic(topic))
        assert got == {**{f"w{i}": 10 for i in range(20)}, "big": 1000, "capped": 5}
    finally:
        await w.close()


async def test_a_held_batch_past_send_at_bytes_goes_at_the_end_of_the_write(
    new_topic, sink_factory, batches_sent, monkeypatch
):
    """Held batches go once they hold SEND_AT_BYTES: the output reaches the broker in steps."""
    from aiostream_ckpt.connectors.kafka import encoder

    monkeypatch.setattr(encoder, "SEND_AT_BYTES", 1000)  # ~30 records of ~30 bytes
    topic = await new_topic(1)
    w = sink_factory(topic).create_writer(ctx())
    await w.recover(None, None)
    try:
        await w.write(recs("a", 10))
        assert batches_sent == []
        await w.write(recs("b", 40))  # 50 records now: past 1000 bytes
        assert batches_sent == [50]
        await w.write(recs("c", 10))
        assert batches_sent == [50]
        await w.prepare_commit(1)
        assert batches_sent == [50, 10]
    finally:
        await w.close()


async def test_hold_batches_false_sends_each_write(new_topic, sink_factory, batches_sent):
    topic = await new_topic(1)
    w = sink_factory(topic, hold_batches=False).create_writer(ctx())
    await w.recover(None, None)
    try:
        for i in range(3):
            await w.write(recs(f"w{i}", 10))
        assert batches_sent == [10, 10, 10]
    finally:
        await w.close()


async def test_keys_and_headers_and_per_key_order(new_topic, sink_factory, kafka_broker):
    from aiokafka import AIOKafkaConsumer

    topic = await new_topic(3)
    sink = sink_factory(
        topic,
        key_fn=lambda r: r["k"],
        headers_fn=lambda r: [("tag", r["tag"].encode())],
    )
    w = sink.create_writer(ctx())
    await w.recover(None, None)
    await w.write(recs("h", 30))
    await w.prepare_commit(1)
    await w.commit(1)
    await w.close()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_broker.bootstrap_servers,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        got: list = []
        while len(got) < 30:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                got.extend(records)
    finally:
        await consumer.stop()
    by_key: dict[bytes, set[int]] = {}
    order: dict[bytes, list[int]] = {}
    for r in got:
        by_key.setdefault(r.key, set()).add(r.partition)
        order.setdefault(r.key, []).append(orjson.loads(r.value)["i"])
        assert r.headers == (("tag", b"h"),)
    assert sorted(by_key) == [b"key-0", b"key-1", b"key-2"]
    assert all(len(p) == 1 for p in by_key.values())  # one key, one partition
    assert all(v == sorted(v) for v in order.values())  # in order


async def test_recovery_commits_listed_and_aborts_unfinished_transactions(
    new_topic, read_topic, sink_factory
):
    """Crash after checkpoint 1 completed but before its commit; checkpoint 2 never completed."""
    topic = await new_topic(1)
    sink = sink_factory(topic, hold_batches=False)  # the open transaction has records
    old = sink.create_writer(ctx())
    await old.recover(None, None)
    await old.write(recs("ckpt1", 7))
    state1 = await old.prepare_commit(1)
    await old.write(recs("ckpt2", 4))
    await old.prepare_commit(2)  # pre-committed, but checkpoint 2 never completes
    await old.write(recs("open", 3))  # open transaction of epoch 3
    # crash: no commit, no close. The open records are sent, not flushed: they reach
    # the broker a moment later (on a busy machine, after a first read).
    everything = {"ckpt1": 7, "ckpt2": 4, "open": 3}
    assert await uncommitted_tags_once(read_topic, topic, everything) == everything
    new = sink.create_writer(ctx())
    await new.recover(state1, 1)
    try:
        # Transaction 1 committed by recovery; 2 and the open one aborted by fencing.
        assert tags(await read_topic(topic)) == {"ckpt1": 7}
        assert tags(await read_topic(topic, isolation_level="read_uncommitted")) == {
            "ckpt1": 7,
            "ckpt2": 4,
            "open": 3,
        }
        # The new writer goes on; its output commits after the recovered one.
        await new.write(recs("after", 2))
        await new.prepare_commit(2)
        await new.commit(2)
        assert tags(await read_topic(topic)) == {"ckpt1": 7, "after": 2}
    finally:
        await new.close()
        await old.close()


async def test_zombie_writer_cannot_commit_after_successor_recovered(
    new_topic, read_topic, sink_factory
):
    topic = await new_topic(1)
    sink = sink_factory(topic)
    zombie = sink.create_writer(ctx())
    await zombie.recover(None, None)
    await zombie.write(recs("z1", 3))
    state1 = await zombie.prepare_commit(1)
    await zombie.write(recs("z2", 3))
    await zombie.prepare_commit(2)
    successor = sink.create_writer(ctx())
    await successor.recover(state1, 1)
    try:
        with pytest.raises(ConnectorError, match="fenced") as info:
            await zombie.commit(2)
        assert not info.value.retriable
        with pytest.raises(ConnectorError, match="fenced"):
            await zombie.write(recs("z3", 1))  # the failure sticks
        assert tags(await read_topic(topic)) == {"z1": 3}
    finally:
        await zombie.close()
        await successor.close()


async def test_recovery_of_a_reused_slot_does_not_commit_newer_records(
    new_topic, read_topic, sink_factory
):
    """The stored (id, epoch) of committed transaction 1 must not commit a later one.

    With pool_size 2, slot 0 carries transaction 1 and, after its commit, the
    open transaction 3. Restoring checkpoint 1's state (checkpoint 2 never
    completed) must commit nothing new: transaction 3's records are replayed.
    """
    topic = await new_topic(1)
    sink = sink_factory(topic, pool_size=2)
    old = sink.create_writer(ctx())
    await old.recover(None, None)
    await old.write(recs("t1", 2))
    state1 = await old.prepare_commit(1)
    await old.write(recs("t2", 2))
    await old.commit(1)
    await old.prepare_commit(2)
    await old.write(recs("t3", 2))  # waits for slot 0's new producer, then opens there
    assert old.transactional_ids[0] == state1["pending"][0][1]
    new = sink.create_writer(ctx())
    await new.recover(state1, 1)  # EndTxn for t1's epoch answers FENCED: a warning
    try:
        assert tags(await read_topic(topic)) == {"t1": 2}
    finally:
        await new.close()
        await old.close()


async def test_pending_transactions_of_an_aborted_checkpoint_commit_with_the_next(
    new_topic, read_topic, sink_factory
):
    topic = await new_topic(1)
    w = sink_factory(topic).create_writer(ctx())
    await w.recover(None, None)
    try:
        await w.write(recs("a", 1))
        await w.prepare_commit(1)  # checkpoint 1 aborted: no commit(1)
        await w.write(recs("b", 1))
        state = await w.prepare_commit(2)
        assert [e[0] for e in state["pending"]] == [1, 2]
        await w.commit(2)
        assert tags(await read_topic(topic)) == {"a": 1, "b": 1}
        assert (await w.prepare_commit(3))["pending"] == []
    finally:
        await w.close()


async def test_at_least_once_flushes_at_the_barrier(
    new_topic, read_topic, sink_factory, batches_sent
):
    topic = await new_topic(2)
    w = sink_factory(topic, semantic="at_least_once").create_writer(ctx())
    await w.recover(None, None)
    try:
        await w.write(recs("x", 50))
        assert batches_sent == [50]  # at least once: not held past the write
        assert await w.prepare_commit(1) == {}
        # Acknowledged at the barrier, and visible without a transaction.
        assert tags(await read_topic(topic)) == {"x": 50}
    finally:
        await w.close()


async def test_missing_output_topic_is_a_one_line_error(kafka_broker, sink_factory, read_topic):
    name = f"missing-{uuid.uuid4().hex[:8]}"
    w = sink_factory(name).create_writer(ctx())
    with pytest.raises(ConnectorError, match="does not exist") as info:
        await w.recover(None, None)
    await w.close()
    assert "\n" not in str(info.value)
    # Not auto-created by our metadata check.
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    await admin.start()
    try:
        assert name not in await admin.list_topics()
    finally:
        await admin.close()


def test_bad_bootstrap_string_is_a_config_error():
    for bad in ("", "nohostport", "host:notaport", "host:99999", "a:1,,b:2"):
        with pytest.raises(ConfigError, match="bootstrap"):
            KafkaSink("t", bad)


def open_connections() -> set[int]:
    """Ids of the aiokafka connections in this process whose socket is open."""
    from aiokafka.conn import AIOKafkaConnection

    gc.collect()
    return {id(o) for o in gc.get_objects() if isinstance(o, AIOKafkaConnection) and o.connected()}


async def test_a_close_cancelled_midway_still_closes_every_connection(new_topic, sink_factory):
    """The sink's task is cancelled while the writer closes, just after a commit.

    aiokafka's ``stop()`` marks a producer closed before it closes its
    connections, and a second call returns at once: a stop cut short by a
    cancel was never finished, its sockets stayed open, and asyncio logged
    ``Unclosed AIOKafkaConnection`` once they were collected (#15 item 5, at
    the end of a recovered run: ``close()`` cancelled the producer replacement
    the last commit had started). Every cleanup step now runs to its end.
    """
    topic = await new_topic(2)
    before = open_connections()  # the fixture's admin client keeps its own
    w = sink_factory(topic).create_writer(ctx())
    await w.recover(None, None)
    await w.write(recs("a", 10))
    await w.prepare_commit(1)
    await w.commit(1)  # the committed slot's producer is replaced in the background
    closing = asyncio.ensure_future(w.close())
    await asyncio.sleep(0)  # closing has begun
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert open_connections() - before == set()


@pytest.mark.parametrize("kind", ["producer", "consumer", "client"])
async def test_a_start_cancelled_while_bootstrapping_closes_its_connection(
    kind, kafka_broker, monkeypatch
):
    """A client start is cancelled while aiokafka's bootstrap asks for metadata.

    ``AIOKafkaClient.bootstrap()`` keeps that connection in a local until the
    answer comes: a cancel there (a start past its deadline on a loaded machine,
    a producer replacement cancelled by ``close()``) left a socket that no
    ``stop()`` knows, logged as ``Unclosed AIOKafkaConnection`` (#15 item 5,
    the recovered run of test_crash_after_checkpoint_durable_before_commit).
    """
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.client import AIOKafkaClient
    from aiokafka.conn import AIOKafkaConnection

    from aiostream_ckpt.connectors.kafka.common import start_with_deadline

    asking = asyncio.Event()
    send = AIOKafkaConnection.send

    def spy(conn: AIOKafkaConnection, request: object, *args: object, **kw: object) -> object:
        if type(request).__name__.startswith("MetadataRequest"):
            asking.set()
        return send(conn, request, *args, **kw)

    monkeypatch.setattr(AIOKafkaConnection, "send", spy)
    servers = kafka_broker.bootstrap_servers
    make, start, stop = {
        "producer": (lambda: AIOKafkaProducer(bootstrap_servers=servers), "start", "stop"),
        "consumer": (lambda: AIOKafkaConsumer(bootstrap_servers=servers), "start", "stop"),
        "client": (lambda: AIOKafkaClient(bootstrap_servers=servers), "bootstrap", "close"),
    }[kind]
    before = open_connections()
    starting = asyncio.ensure_future(
        start_with_deadline(
            make,
            lambda c: getattr(c, start)(),
            lambda c: getattr(c, stop)(),
            bootstrap_servers=servers,
            timeout_s=30,
            what=kind,
        )
    )
    await asking.wait()  # the bootstrap connection waits for its metadata
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert open_connections() - before == set()
