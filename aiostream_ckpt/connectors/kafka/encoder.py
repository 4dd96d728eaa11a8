"""Records to per-partition Kafka batches on one producer, with their delivered offsets.

The offsets matter for recovery: a pre-committed transaction lists, per
partition, the first and last offset it wrote, so a recovery that finds the
transaction already ended can tell (by reading that range with
``read_committed``) whether its records are in the output or were lost, and
name the range if they were.

Batches: records append to one open batch per partition. An at-least-once
writer submits them at the end of each write; an exactly-once one
(``hold=True``) keeps a batch open across writes until it holds
:data:`SEND_AT_BYTES` at the end of a write, is full, or the barrier's flush
(:meth:`RecordEncoder.submit_held`): its records are invisible until the
commit anyway, and the job's and the broker's CPU per record fall steeply
with the batch (a write's ~1000 records a partition cost about twice).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from aiokafka import errors as kafka_errors
from aiokafka.partitioner import DefaultPartitioner

from aiostream_ckpt.connectors.base import RecordErrorFn, raise_record_error
from aiostream_ckpt.connectors.kafka.common import connector_error
from aiostream_ckpt.errors import ConnectorError
from aiostream_ckpt.user_errors import function_name

if TYPE_CHECKING:
    from aiostream_ckpt.connectors.kafka.sink import KafkaSink

Serializer = Callable[[Any], bytes]
KeyFn = Callable[[Any], bytes | str | None]
HeadersFn = Callable[[Any], Iterable[tuple[str, bytes]] | None]

_KEY_CACHE_MAX = 100_000
#: Delivered batches are checked (and their offsets noted) every this many submits.
_CHECK_EVERY = 1024
#: Bytes of open batches (all partitions) ``hold=True`` keeps between writes: a bound
#: for topics with many partitions, where each batch would take long to fill.
HOLD_MAX_BYTES = 4 * 1024 * 1024
#: A held batch this big is sent at the end of a write: past ~3000 records a batch the
#: CPU per record hardly falls, and output that reaches the broker in steps of a
#: quarter batch keeps its high watermark (the bench's progress) moving smoothly.
SEND_AT_BYTES = 128 * 1024

#: Headers of records without ``headers_fn`` (the C builder reads, never keeps, the list).
_NO_HEADERS: list[tuple[str, bytes]] = []

#: Per partition, ``[first offset, last offset]`` written by one transaction.
OffsetRanges = dict[int, list[int]]


class RecordEncoder:
    """Turns records into per-partition batches on one producer; tracks their delivery."""

    def __init__(
        self,
        sink: KafkaSink,
        partitions: list[int],
        *,
        hold: bool = False,
        serializer: Serializer | None = None,
        key_fn: KeyFn | None = None,
    ) -> None:
        self._topic = sink.topic
        #: a format's encoders (``KafkaSink(value_format=, key_format=)``) replace the sink's own
        self._dumps = serializer or sink.serializer
        self._key_fn = key_fn or sink.key_fn
        self._headers_fn = sink.headers_fn
        self._partitions = partitions
        #: the topic's partitions, as the metadata listed them at start
        self.partitions = tuple(partitions)
        self._partitioner = DefaultPartitioner()
        self._key_partition: dict[bytes, int] = {}
        #: ``KafkaSink(partitioner=KeyGroupPartitioner)``: partitions by the stream key's group
        self._by_key_group = sink.partitioner
        self._group_partition: dict[Any, int] = {}
        self._sorted = sorted(partitions)
        self._round_robin = 0
        self._pending: list[tuple[asyncio.Future[Any], int]] = []
        self._ranges: OffsetRanges = {}
        self._hold = hold
        #: open batches per partition, and the producer (transaction) they belong to
        self._builders: dict[int, Any] = {}
        self._producer: Any = None

    def _partition(self, key: bytes | None) -> int:
        if key is None:
            return self._partitions[self._round_robin % len(self._partitions)]
        p = self._key_partition.get(key)
        if p is None:
            if len(self._key_partition) >= _KEY_CACHE_MAX:
                self._key_partition.clear()
            p = self._partitioner(key, self._partitions, self._partitions)
            self._key_partition[key] = p
        return p

    def _key_group_partition(self, key: Any) -> int:
        p = self._group_partition.get(key)
        if p is None:
            assert self._by_key_group is not None
            if len(self._group_partition) >= _KEY_CACHE_MAX:
                self._group_partition.clear()
            p = self._sorted[self._by_key_group.partition_of_key(key, len(self._sorted))]
            self._group_partition[key] = p
        return p

    async def send(
        self, producer: Any, batch: list[Any], record_failed: RecordErrorFn = raise_record_error
    ) -> int:
        """Append ``batch`` to per-partition batches; submit when full, and at the end unless held.

        The per-record loop is the sink's hot path (measured): cached key ->
        partition lookups inline, no per-record method calls beyond the user's,
        and records go straight to the batch's C builder, as
        ``BatchBuilder.append`` does after its checks (0.25 against 0.7 us a
        record; private to aiokafka, which is pinned for the sink's internals).
        A record the serializer, ``key_fn`` or ``headers_fn`` raises on goes to
        ``record_failed`` before any of it is appended; when that returns
        (dead-lettered), the batch goes on without it. Returns the records sent.
        """
        if self._builders and producer is not self._producer:
            raise ConnectorError(
                "records held for one Kafka transaction sent on another producer "
                "(submit_held() was not called at the barrier)"
            )
        self._producer = producer
        dumps, key_fn, headers_fn = self._dumps, self._key_fn, self._headers_fn
        cache = self._key_partition
        by_key_group = self._by_key_group
        group_of = None if by_key_group is None else by_key_group.key_selector
        group_cache = self._group_partition
        builders = self._builders
        self._round_robin += 1
        sent = len(batch)
        for record in batch:
            key: Any = None
            p: int | None = None
            try:
                value = dumps(record)
                if key_fn is not None:
                    key = key_fn(record)
                    if key.__class__ is str:
                        key = key.encode()
                    if group_of is None and key is not None:
                        p = cache.get(key)
                if group_of is not None:
                    group_key = group_of(record)
                    p = group_cache.get(group_key)
                    if p is None:
                        p = self._key_group_partition(group_key)
                headers = _NO_HEADERS if headers_fn is None else list(headers_fn(record) or ())
            except Exception as exc:
                record_failed(self._failed_function(record), record, exc)  # raises unless
                sent -= 1  # dead-lettered
                continue
            if p is None:
                p = self._partition(key)
            builder = builders.get(p)
            if builder is None:
                builder = builders[p] = producer.create_batch()
            n = builder._relative_offset
            if builder._builder.append(n, None, key, value, headers) is not None:
                builder._relative_offset = n + 1
            else:  # full
                builder.close()
                await self._submit(producer, builder, p)
                builder = builders[p] = producer.create_batch()
                if builder.append(timestamp=None, key=key, value=value, headers=headers) is None:
                    raise ConnectorError(
                        f"record of {len(value)} bytes does not fit in a Kafka batch "
                        "(raise max_batch_size in producer_config)",
                        retriable=False,
                    )
        if not self._hold or sum(b.size() for b in builders.values()) > HOLD_MAX_BYTES:
            await self.submit_held(producer)
        else:
            for p, builder in [(p, b) for p, b in builders.items() if b.size() >= SEND_AT_BYTES]:
                del builders[p]
                await self._submit(producer, builder, p)
        return sent

    async def send_as_they_were(
        self,
        producer: Any,
        records: Iterable[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]], int]],
    ) -> int:
        """Send records already serialized (partition, key, value, headers, timestamp ms).

        A savepoint's copy of a transaction written again (see
        :mod:`.savepoint_copy`): same partitions, keys, values, headers and
        create times. Returns the records sent.
        """
        if self._builders and producer is not self._producer:
            raise ConnectorError("records held for one Kafka transaction sent on another producer")
        self._producer = producer
        builders = self._builders
        sent = 0
        for p, key, value, headers, timestamp in records:
            if p not in self.partitions:
                raise ConnectorError(
                    f"a savepoint's copy writes to {self._topic}[{p}], which the topic lacks "
                    f"(partitions {', '.join(map(str, self.partitions))})",
                    retriable=False,
                )
            builder = builders.get(p)
            if builder is None:
                builder = builders[p] = producer.create_batch()
            if builder.append(timestamp=timestamp, key=key, value=value, headers=headers) is None:
                builder.close()
                await self._submit(producer, builder, p)
                builder = builders[p] = producer.create_batch()
                if (
                    builder.append(timestamp=timestamp, key=key, value=value, headers=headers)
                    is None
                ):
                    raise ConnectorError(
                        f"a record of {len(value or b'')} bytes does not fit in a Kafka batch "
                        "(raise max_batch_size in producer_config)",
                        retriable=False,
                    )
            sent += 1
        await self.submit_held(producer)
        return sent

    async def submit_held(self, producer: Any) -> None:
        """Submit every open batch on ``producer`` (before flushing it)."""
        builders, self._builders = self._builders, {}
        for p, builder in builders.items():
            if builder.record_count():
                await self._submit(producer, builder, p)

    def _failed_function(self, record: Any) -> str:
        """Which of the sink's functions raises on ``record`` (they are run again to tell)."""
        by_key_group = self._by_key_group
        for what, fn in (
            ("serializer", self._dumps),
            ("key_fn", self._key_fn),
            ("key selector", None if by_key_group is None else by_key_group.key_selector),
            ("headers_fn", self._headers_fn),
        ):
            if fn is None:
                continue
            try:
                fn(record)
            except Exception:
                return f"{what} {function_name(fn)}"
        return f"serializer {function_name(self._dumps)}"

    async def _submit(self, producer: Any, builder: Any, partition: int) -> None:
        count = builder.record_count()
        try:
            fut = await producer.send_batch(builder, self._topic, partition=partition)
        except kafka_errors.KafkaError as exc:
            raise connector_error(f"send to {self._topic}[{partition}] failed", exc) from exc
        self._pending.append((fut, count))
        if len(self._pending) > _CHECK_EVERY:
            self.check_delivered(done_only=True)

    def check_delivered(self, *, done_only: bool = False) -> None:
        """Raise the first delivery failure; note delivered batches' offsets and forget them."""
        still = []
        ranges = self._ranges
        for fut, count in self._pending:
            if not fut.done():
                if done_only:
                    still.append((fut, count))
                    continue
                raise ConnectorError("a Kafka batch was not delivered by flush()", retriable=True)
            exc = fut.exception()
            if exc is not None:
                self._pending = []
                raise connector_error(f"delivery to {self._topic} failed", exc) from exc
            meta = fut.result()
            if meta is None or meta.offset is None or meta.offset < 0:
                continue
            last = meta.offset + count - 1
            span = ranges.get(meta.partition)
            if span is None:
                ranges[meta.partition] = [meta.offset, last]
            else:
                span[0] = min(span[0], meta.offset)
                span[1] = max(span[1], last)
        self._pending = still

    def take_ranges(self) -> OffsetRanges:
        """Offsets written since the last call (call after :meth:`check_delivered`)."""
        ranges, self._ranges = self._ranges, {}
        return ranges

    def reset(self) -> None:
        """Forget batches of an aborted transaction."""
        self._pending = []
        self._ranges = {}
        self._builders = {}
        self._producer = None
