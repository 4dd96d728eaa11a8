"""Kafka topics as proven output: what a ``read_committed`` consumer sees, read by the proof itself.

An app in Kafka mode commits its output by transactions, so the committed
output is what a ``read_committed`` consumer reads: up to the last stable
offset, with aborted records and transaction markers left out. This module
reads it with a plain ``aiokafka`` consumer and shares no code with the
project's Kafka source or sink (:mod:`aiostream_ckpt.connectors.kafka`): a
bug there cannot hide itself from the proof. It also makes and drops the
reference run's topics.

Records come in ``(partition, offset)`` order, and a key's records live in
one partition, so a declared key's commit order is its offset order.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiostream_ckpt_dev.validate.errors import ValidationConfigError, ValidationError
from aiostream_ckpt_dev.validate.parse import canonical

#: Seconds to read one topic to its end (or to create/delete topics) before giving up.
TIMEOUT_S = 600.0


@dataclass(frozen=True)
class KafkaTopic:
    """One topic of one cluster: an output location, like a file sink's directory.

    ``decode`` turns each committed value into JSON before it is compared
    (Avro topics: :mod:`.confluent_avro`); None: values are compared as they are.
    """

    bootstrap: str
    topic: str
    decode: Callable[[bytes], bytes] | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"kafka://{self.bootstrap}/{self.topic}"


def app_topic(contract: Any, params: Mapping[str, Any], bootstrap: str, param: str) -> KafkaTopic:
    """Return the topic an app param names, with the decoder its value format calls for."""
    from aiostream_ckpt_dev.validate.confluent_avro import value_decoder

    decode = value_decoder(contract.kafka_value_format, contract.kafka_schema_registry, params)
    return KafkaTopic(bootstrap, str(params[param]), decode)


def registry_of(topic: KafkaTopic) -> str | None:
    """Return the registry URL a topic's values are decoded with (None: JSON as is)."""
    return getattr(topic.decode, "registry_url", None)


def with_registry(topic: KafkaTopic, registry_url: str | None) -> KafkaTopic:
    """``topic`` decoding Confluent Avro values with ``registry_url`` (None: as it is)."""
    if registry_url is None:
        return topic
    from aiostream_ckpt_dev.validate.confluent_avro import ConfluentAvroDecoder

    return replace(topic, decode=ConfluentAvroDecoder(registry_url))


def read_committed(
    where: KafkaTopic, key: str | None = None, ignore: Sequence[str] = ()
) -> list[tuple[str, Any, bool, str]]:
    """Every committed record of ``where`` now: canonical form, key, parsed, ``topic/p@offset``."""
    raw = asyncio.run(_drain(where))
    out = []
    decode = where.decode
    for partition, offset, value in raw:
        canon, k, ok = canonical(value if decode is None else decode(value), key, ignore)
        out.append((canon, k, ok, f"{where.topic}/{partition}@{offset}"))
    return out


def write_values(where: KafkaTopic, path: Path) -> int:
    """Write every committed value of ``where`` to ``path``, one a line; return how many.

    The input of an app in Kafka mode, for its oracle, which reads input
    files. Values are written as they are (one without a value as an empty
    line); a value with a newline in it cannot be one line and is an error.
    """
    n = 0
    with open(path, "wb") as f:
        for partition, offset, value in asyncio.run(_drain(where)):
            if value is not None and where.decode is not None:
                value = where.decode(value)
            if value is not None and b"\n" in value:
                raise ValidationError(
                    f"{where.topic}/{partition}@{offset}: the value holds a newline, so the "
                    "oracle cannot read the topic as lines"
                )
            f.write((value or b"") + b"\n")
            n += 1
    return n


async def _consumer(bootstrap: str) -> Any:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        group_id=None,
        max_partition_fetch_bytes=8 << 20,
        request_timeout_ms=30_000,
    )
    await consumer.start()
    return consumer


async def _describe(where: KafkaTopic) -> list[dict[str, Any]] | None:
    """Return the topic's partitions' metadata by a fresh request (None: no such topic)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=where.bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([where.topic])
    finally:
        await admin.close()
    for t in described:
        if t.get("topic", t.get("name")) == where.topic and t.get("error_code", 0) == 0:
            return list(t["partitions"])
    return None


async def _partitions(where: KafkaTopic) -> list[int]:
    """Return the topic's partition numbers (a consumer's metadata cache may lack them)."""
    described = await _describe(where)
    if described is None:
        raise ValidationConfigError(f"topic {where.topic!r} does not exist at {where.bootstrap}")
    return sorted(int(p.get("partition", p.get("partition_index", -1))) for p in described)


async def _drain(where: KafkaTopic) -> list[tuple[int, int, bytes]]:
    """``(partition, offset, value)`` of every committed record up to the last stable offsets."""
    from aiokafka import TopicPartition

    try:
        consumer = await asyncio.wait_for(_consumer(where.bootstrap), 60)
    except Exception as exc:
        raise ValidationError(f"cannot reach Kafka at {where.bootstrap}: {exc!r}") from exc
    try:
        tps = [TopicPartition(where.topic, p) for p in await _partitions(where)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        # read_committed: the last stable offset, not the high watermark (aiokafka >= 0.13)
        end = await consumer.end_offsets(tps)
        got: dict[Any, list[tuple[int, int, bytes]]] = {tp: [] for tp in tps}

        async def drain() -> None:
            active = [tp for tp in tps if end[tp] > await consumer.position(tp)]
            while active:
                batch = await consumer.getmany(*active, timeout_ms=500, max_records=50_000)
                for tp, records in batch.items():
                    got[tp].extend(
                        (tp.partition, r.offset, r.value) for r in records if r.offset < end[tp]
                    )
                active = [tp for tp in active if await consumer.position(tp) < end[tp]]

        try:
            await asyncio.wait_for(drain(), TIMEOUT_S)
        except TimeoutError:
            raise ValidationError(
                f"reading {where} read_committed did not reach its end offsets in {TIMEOUT_S:g}s"
            ) from None
        return [r for tp in tps for r in got[tp]]
    finally:
        await consumer.stop()


def record_span(where: KafkaTopic) -> int:
    """Return the offsets ``where`` spans (records, markers, aborted records): its size."""

    async def span() -> int:
        from aiokafka import TopicPartition

        consumer = await _consumer(where.bootstrap)
        try:
            tps = [TopicPartition(where.topic, p) for p in await _partitions(where)]
            first = await consumer.beginning_offsets(tps)
            last = await consumer.end_offsets(tps)
            return sum(last[tp] - first[tp] for tp in tps)
        finally:
            await consumer.stop()

    return asyncio.run(span())


def new_twin(of: KafkaTopic, label: str) -> KafkaTopic:
    """Create an empty topic with ``of``'s partitions, named after it; return it once led."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    twin = replace(of, topic=f"{of.topic}.{label}-{uuid.uuid4().hex[:8]}")

    async def create() -> None:
        partitions = len(await _partitions(of))
        admin = AIOKafkaAdminClient(bootstrap_servers=of.bootstrap)
        await admin.start()
        try:
            await admin.create_topics(
                [NewTopic(twin.topic, num_partitions=partitions, replication_factor=1)]
            )
        finally:
            await admin.close()
        for _ in range(300):  # producing before every partition has a leader only earns retries
            described = await _describe(twin) or []
            if len(described) == partitions and all(p.get("leader", -1) >= 0 for p in described):
                return
            await asyncio.sleep(0.1)
        raise ValidationError(f"topic {twin.topic}: its {partitions} partitions got no leaders")

    asyncio.run(create())
    return twin


def drop_topics(topics: Sequence[KafkaTopic]) -> None:
    """Delete the proof's own topics (reference and round twins); errors are not fatal."""
    from aiokafka.admin import AIOKafkaAdminClient

    by_cluster: dict[str, list[str]] = {}
    for t in topics:
        by_cluster.setdefault(t.bootstrap, []).append(t.topic)

    async def drop(bootstrap: str, names: list[str]) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.delete_topics(names)
        finally:
            await admin.close()

    for bootstrap, names in by_cluster.items():
        with contextlib.suppress(Exception):  # a leftover scratch topic fails no proof
            asyncio.run(drop(bootstrap, names))
