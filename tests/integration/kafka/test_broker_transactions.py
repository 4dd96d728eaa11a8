"""The real broker does real transactions with aiokafka 0.14, including 2PC recovery.

These pin the broker answers the Kafka sink's recovery relies on (see the table
in ``aiostream_ckpt.connectors.kafka.transactions``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import ProducerFenced

from aiostream_ckpt.connectors.kafka.transactions import (
    EndTxnOutcome,
    PreparedTransaction,
    abort_prepared_transaction,
    commit_prepared_transaction,
    prepared_transaction,
)

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def txn_id() -> str:
    return f"txn-{uuid.uuid4().hex[:12]}"


def producer(bootstrap: str, transactional_id: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id)


async def commit(bootstrap: str, txn: PreparedTransaction) -> EndTxnOutcome:
    return await commit_prepared_transaction(bootstrap, *txn)


async def abort(bootstrap: str, txn: PreparedTransaction) -> EndTxnOutcome:
    return await abort_prepared_transaction(bootstrap, *txn)


async def test_read_committed_sees_committed_records_only(kafka_broker, new_topic, read_topic):
    bootstrap = kafka_broker.bootstrap_servers
    topic = await new_topic(1)
    a, b = producer(bootstrap, txn_id()), producer(bootstrap, txn_id())
    await a.start()
    await b.start()
    try:
        async with a.transaction():
            await a.send(topic, b"c1")
            await a.send(topic, b"c2")
        epoch = prepared_transaction(a).producer_epoch
        await a.begin_transaction()
        await a.send(topic, b"a1")
        await a.abort_transaction()
        # b's transaction stays open (in flight) while a commits after it.
        await b.begin_transaction()
        await (await b.send(topic, b"i1"))
        async with a.transaction():
            await a.send(topic, b"c3")

        everything = [b"c1", b"c2", b"a1", b"i1", b"c3"]
        assert await read_topic(topic, isolation_level="read_uncommitted") == everything
        # The last stable offset stops at the open transaction, hiding c3 for now.
        assert await read_topic(topic) == [b"c1", b"c2"]

        await b.commit_transaction()
        assert await read_topic(topic) == [b"c1", b"c2", b"i1", b"c3"]
        # EndTxn v0 takes the classic path: no epoch bump per transaction.
        assert prepared_transaction(a).producer_epoch == epoch
    finally:
        await a.stop()
        await b.stop()


async def test_zombie_producer_is_fenced(kafka_broker, new_topic, read_topic):
    bootstrap = kafka_broker.bootstrap_servers
    topic, tid = await new_topic(1), txn_id()
    zombie = producer(bootstrap, tid)
    await zombie.start()
    successor = producer(bootstrap, tid)
    try:
        await zombie.begin_transaction()
        await zombie.send_and_wait(topic, b"zombie")
        old = prepared_transaction(zombie)

        await successor.start()  # InitProducerId: bumps the epoch, aborts the zombie's txn
        assert prepared_transaction(successor).producer_epoch > old.producer_epoch
        with pytest.raises(ProducerFenced):
            await zombie.commit_transaction()

        async with successor.transaction():
            await successor.send(topic, b"successor")
        assert await read_topic(topic) == [b"successor"]
    finally:
        await zombie.stop()
        await successor.stop()


async def test_commit_prepared_transaction_after_crash(
    kafka_broker, new_topic, read_topic, crash_after_precommit
):
    bootstrap = kafka_broker.bootstrap_servers
    topic, tid = await new_topic(3), txn_id()
    txn = await crash_after_precommit(topic, tid, records=30, partitions=3)

    assert len(await read_topic(topic, isolation_level="read_uncommitted")) == 30
    assert await read_topic(topic) == []

    assert await commit(bootstrap, txn) is EndTxnOutcome.COMPLETED
    expected = Counter(f"{tid}:{i}".encode() for i in range(30))
    assert Counter(await read_topic(topic)) == expected

    # A recovery that crashed after committing commits again: still fine, still once.
    assert await commit(bootstrap, txn) is EndTxnOutcome.COMPLETED
    assert Counter(await read_topic(topic)) == expected

    # Once a new producer took over the id, the old epoch is fenced, even
    # though the transaction was committed.
    successor = producer(bootstrap, tid)
    await successor.start()
    assert prepared_transaction(successor).producer_epoch == txn.producer_epoch + 1
    await successor.stop()
    assert await commit(bootstrap, txn) is EndTxnOutcome.FENCED
    assert Counter(await read_topic(topic)) == expected


async def test_commit_after_new_producer_aborted_it_is_fenced(
    kafka_broker, new_topic, read_topic, crash_after_precommit
):
    bootstrap = kafka_broker.bootstrap_servers
    topic, tid = await new_topic(1), txn_id()
    txn = await crash_after_precommit(topic, tid)

    successor = producer(bootstrap, tid)
    await successor.start()  # its InitProducerId aborts the prepared transaction
    new_epoch = prepared_transaction(successor).producer_epoch
    await successor.stop()

    assert await commit(bootstrap, txn) is EndTxnOutcome.FENCED
    assert await read_topic(topic) == []
    # Kafka bumps once to abort the open transaction and once for the new producer.
    assert new_epoch == txn.producer_epoch + 2


async def test_abort_prepared_transaction(
    kafka_broker, new_topic, read_topic, crash_after_precommit
):
    bootstrap = kafka_broker.bootstrap_servers
    topic, tid = await new_topic(1), txn_id()
    txn = await crash_after_precommit(topic, tid)

    assert await abort(bootstrap, txn) is EndTxnOutcome.COMPLETED
    assert await abort(bootstrap, txn) is EndTxnOutcome.COMPLETED
    assert await commit(bootstrap, txn) is EndTxnOutcome.INVALID_STATE
    assert await read_topic(topic) == []
    assert len(await read_topic(topic, isolation_level="read_uncommitted")) == 5


async def test_abort_after_commit_is_invalid_state(
    kafka_broker, new_topic, read_topic, crash_after_precommit
):
    bootstrap = kafka_broker.bootstrap_servers
    topic, tid = await new_topic(1), txn_id()
    txn = await crash_after_precommit(topic, tid)

    assert await commit(bootstrap, txn) is EndTxnOutcome.COMPLETED
    assert await abort(bootstrap, txn) is EndTxnOutcome.INVALID_STATE
    assert len(await read_topic(topic)) == 5


async def test_unknown_transactional_id(kafka_broker):
    txn = PreparedTransaction(txn_id(), 123456, 0)
    assert await commit(kafka_broker.bootstrap_servers, txn) is EndTxnOutcome.UNKNOWN_PRODUCER_ID


async def test_wrong_producer_id_for_known_transactional_id(
    kafka_broker, new_topic, crash_after_precommit
):
    topic, tid = await new_topic(1), txn_id()
    txn = await crash_after_precommit(topic, tid)
    wrong = txn._replace(producer_id=txn.producer_id + 1000)
    assert await commit(kafka_broker.bootstrap_servers, wrong) is EndTxnOutcome.UNKNOWN_PRODUCER_ID
    assert await abort(kafka_broker.bootstrap_servers, txn) is EndTxnOutcome.COMPLETED


async def test_timed_out_transaction_is_aborted_and_fenced(
    kafka_broker, new_topic, read_topic, crash_after_precommit
):
    bootstrap = kafka_broker.bootstrap_servers
    topic, tid = await new_topic(1), txn_id()
    txn = await crash_after_precommit(topic, tid, timeout_ms=1000)

    # Wait for the broker's abort: the last stable offset then passes the
    # abort marker and reaches the high watermark.
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        for _ in range(100):
            if (await consumer.end_offsets([tp]))[tp] > 5:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("broker did not abort the timed-out transaction within 10 s")
    finally:
        await consumer.stop()

    assert await commit(bootstrap, txn) is EndTxnOutcome.FENCED
    assert await read_topic(topic) == []


async def test_prepared_transaction_survives_broker_crash(
    kafka_broker, new_topic, read_topic, crash_after_precommit
):
    """kill -9 of the session's broker; ``start()`` brings it back on its ports and data."""
    bootstrap = kafka_broker.bootstrap_servers
    topic, tid = await new_topic(2), txn_id()
    txn = await crash_after_precommit(topic, tid, records=10, partitions=2)

    kafka_broker.kill()
    # In the main thread, so that PDEATHSIG still ties the broker to this process.
    kafka_broker.start()
    assert kafka_broker.bootstrap_servers == bootstrap

    assert await commit(bootstrap, txn) is EndTxnOutcome.COMPLETED
    got = await read_topic(topic)
    assert Counter(got) == Counter(f"{tid}:{i}".encode() for i in range(10))
