"""The reader of a :class:`~.source.KafkaSource`: one subtask's partitions and offsets.

Apart from the source so that declaring a job's Kafka source (what the main
process does with ``job.workers`` > 1, to plan the job it coordinates) does
not import aiokafka: only the processes that read import it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka import errors as kafka_errors

from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.kafka.common import (
    bootstrap_client,
    connector_error,
    require_topics,
    run_to_end,
    split_id,
    start_with_deadline,
)
from aiostream_ckpt.connectors.kafka.fetch import install_lean_fetch
from aiostream_ckpt.connectors.kafka.security import merged_config
from aiostream_ckpt.connectors.key_grouped import assign_key_grouped, partition_key_groups
from aiostream_ckpt.connectors.required import required_problem, required_violations
from aiostream_ckpt.connectors.splits import assign_splits
from aiostream_ckpt.errors import ConnectorError
from aiostream_ckpt.keygroups import KeyGroupRange

if TYPE_CHECKING:
    from aiostream_ckpt.connectors.kafka.source import KafkaSource

log = logging.getLogger(__name__)

#: Snapshots kept for offset commits to Kafka; more only when checkpoints abort.
_MAX_SNAPSHOTS = 32


class KafkaSourceReader:
    """One subtask's partitions; positions are the next offset to emit per partition."""

    def __init__(self, source: KafkaSource, ctx: ConnectorContext) -> None:
        self._src = source
        self._ctx = ctx
        self._consumer: Any = None
        self._own: list[Any] = []
        self._positions: dict[Any, int] = {}
        self._end: dict[Any, int] = {}
        self._active: list[Any] = []
        #: checkpoint id -> positions, for the offset commits of ``group_id`` (oldest first)
        self._snapshots: dict[int, dict[Any, int]] = {}
        self._closed = False
        #: what ``_emit`` decodes with: the source's deserializers, or its formats' decoders
        self._loads: Any = source.deserializer
        self._key_loads: Any = source.key_deserializer
        self._decoders: list[tuple[Any, bool]] = []  # (decoder, of the key)
        self._registries: list[Any] = []
        self._group: str | None = None
        self._client_config: dict[str, Any] = {}

    @property
    def partitions(self) -> list[tuple[str, int]]:
        """The partitions this reader owns, as ``(topic, partition)``."""
        return [(tp.topic, tp.partition) for tp in self._own]

    # -- start ------------------------------------------------------------------

    async def start(self, restored: dict[str, Any] | None) -> None:
        src, ctx = self._src, self._ctx
        group = None
        if src.commits_offsets:
            group = src.group_id or f"{ctx.job_name}-{ctx.operator_uid}"
        self._group = group
        #: the job's TLS/SASL settings (``kafka.*``) under the source's own consumer_config
        self._client_config = merged_config(ctx.kafka_security, src.consumer_config)
        config: dict[str, Any] = {
            "isolation_level": src.isolation_level,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            **self._client_config,
            "group_id": group,
        }

        async def start(c: Any) -> None:
            await c.start()

        async def stop(c: Any) -> None:
            await c.stop()

        self._consumer = await start_with_deadline(
            lambda: AIOKafkaConsumer(bootstrap_servers=src.bootstrap_servers, **config),
            start,
            stop,
            bootstrap_servers=src.bootstrap_servers,
            timeout_s=src.connect_timeout_s,
            what="consumer start",
            config=config,
        )
        install_lean_fetch(self._consumer)  # _emit reads only offset, key and value
        if src.value_format is not None or src.key_format is not None:
            await self._open_formats()
        try:
            await asyncio.wait_for(self._assign(restored or {}), src.connect_timeout_s)
        except TimeoutError as exc:
            raise ConnectorError(
                f"Kafka source {src.name}: no offsets from {src.bootstrap_servers} within "
                f"{src.connect_timeout_s:g}s",
                retriable=True,
            ) from exc
        except kafka_errors.KafkaError as exc:
            raise connector_error(f"Kafka source {src.name}: cannot seek", exc) from exc
        log.info(
            "%s[%d]: reading %s from %s",
            src.name,
            ctx.subtask_index,
            ", ".join(f"{tp.topic}:{tp.partition}@{self._positions[tp]}" for tp in self._own)
            or "no partitions",
            "restored offsets" if restored else f"{src.starting} (fresh start)",
        )

    async def _open_formats(self) -> None:
        """One registry client per registry, a decoder per format (see ``formats.base``)."""
        src = self._src
        clients: dict[Any, Any] = {}
        for fmt, is_key in ((src.value_format, False), (src.key_format, True)):
            if fmt is None:
                continue
            client = clients.get(fmt.registry)
            if client is None:
                client = clients[fmt.registry] = fmt.registry.client()
                self._registries.append(client)
            decoder = await fmt.decoder(client)
            self._decoders.append((decoder, is_key))
            if is_key:
                self._key_loads = decoder.decode
            else:
                self._loads = decoder.decode

    async def _prepare(self, records: list[Any]) -> None:
        """Fetch the schemas of ids this batch brings that no earlier batch did."""
        for decoder, is_key in self._decoders:
            await decoder.prepare([r.key if is_key else r.value for r in records])

    async def _assign(self, restored: dict[str, Any]) -> None:
        src, ctx, consumer = self._src, self._ctx, self._consumer
        client = await bootstrap_client(
            src.bootstrap_servers,
            self._client_config,
            timeout_s=src.connect_timeout_s,
            what="source metadata",
        )
        try:
            topics = await require_topics(
                client, src.topics, bootstrap_servers=src.bootstrap_servers, clock=ctx.clock
            )
        finally:
            await run_to_end(client.close(), timeout_s=None)
        every = [TopicPartition(t, p) for t in sorted(topics) for p in topics[t]]
        if src.key_grouped:
            self._own = self._key_grouped(every, topics)
        else:
            self._own = assign_splits(every, ctx, source=f"Kafka source {src.name!r}")
        consumer.assign(self._own)
        if not self._own:
            return
        fresh = [tp for tp in self._own if split_id(tp.topic, tp.partition) not in restored]
        for tp in self._own:
            if tp not in fresh:
                self._positions[tp] = int(restored[split_id(tp.topic, tp.partition)])
        if fresh:
            self._positions.update(await self._starting_offsets(fresh))
        for tp, offset in self._positions.items():
            consumer.seek(tp, offset)
        if src.bounded:
            self._end = {tp: int(o) for tp, o in (await consumer.end_offsets(self._own)).items()}
            self._active = [tp for tp in self._own if self._positions[tp] < self._end[tp]]
            done = [tp for tp in self._own if tp not in self._active]
            if done:
                consumer.pause(*done)
        else:
            self._active = list(self._own)

    def _key_grouped(self, every: list[Any], topics: dict[str, list[int]]) -> list[Any]:
        """Return the partitions whose key groups this subtask owns (``key_grouped=True``)."""
        ctx, what = self._ctx, f"Kafka source {self._src.name!r}"
        maxp = ctx.max_parallelism
        ranges: dict[str, KeyGroupRange] = {}
        for topic, partitions in topics.items():
            layout = partition_key_groups(len(partitions), maxp, source=f"{what} topic {topic}")
            for j, p in enumerate(sorted(partitions)):
                ranges[split_id(topic, p)] = layout[j]
        own = set(assign_key_grouped(ranges, maxp, ctx, source=what))
        return [tp for tp in every if split_id(tp.topic, tp.partition) in own]

    async def _starting_offsets(self, tps: list[Any]) -> dict[Any, int]:
        consumer, starting = self._consumer, self._src.starting
        if starting == "earliest":
            return {tp: int(o) for tp, o in (await consumer.beginning_offsets(tps)).items()}
        end = {tp: int(o) for tp, o in (await consumer.end_offsets(tps)).items()}
        if starting == "latest":
            return end
        assert isinstance(starting, dict)
        found = await consumer.offsets_for_times(dict.fromkeys(tps, starting["timestamp"]))
        return {tp: int(found[tp].offset) if found.get(tp) else end[tp] for tp in tps}

    # -- reading ----------------------------------------------------------------

    async def read_batch(self, max_records: int) -> list[Any] | None:
        parts = await self._fetch(max_records)
        if parts is None:
            return None
        if len(parts) == 1:
            return parts[0][1]
        return [event for _, events in parts for event in events]

    async def read_split_batches(self, max_records: int) -> list[tuple[str, list[Any]]] | None:
        """Event time: the same fetch, grouped by partition for per-partition watermarks."""
        parts = await self._fetch(max_records)
        if parts is None:
            return None
        return [(split_id(tp.topic, tp.partition), events) for tp, events in parts]

    def active_splits(self) -> list[str]:
        """Return the partitions still being read (finished ones release the watermark)."""
        return [split_id(tp.topic, tp.partition) for tp in self._active]

    async def has_backlog(self, split: str) -> bool:
        """Whether records of ``split`` wait to be read: event time moves at chunk ends then.

        A bounded partition has them until its end offset; an unbounded one until
        the consumer's position reaches what it may read (the last stable offset
        under ``read_committed``, else the high watermark, as of the last fetch).
        Unknown counts as caught up: the watermark then moves as it did per read.
        """
        tp = next((t for t in self._active if split_id(t.topic, t.partition) == split), None)
        if tp is None:
            return False
        if self._src.bounded:
            return True
        consumer = self._consumer
        if self._src.isolation_level == "read_committed":
            available = consumer.last_stable_offset(tp)
        else:
            available = consumer.highwater(tp)
        if available is None:
            return False
        return bool(await consumer.position(tp) < available)

    async def _fetch(self, max_records: int) -> list[tuple[Any, list[Any]]] | None:
        src = self._src
        if not self._active:
            if src.bounded:
                return None
            await asyncio.sleep(src.poll_timeout_ms / 1000)
            return []
        try:
            data = await self._consumer.getmany(
                *self._active, timeout_ms=src.poll_timeout_ms, max_records=max_records
            )
        except kafka_errors.KafkaError as exc:
            raise connector_error(f"Kafka source {src.name}: fetch failed", exc) from exc
        if self._decoders:
            for records in data.values():
                await self._prepare(records)
        parts: list[tuple[Any, list[Any]]] = []
        for tp, records in data.items():
            if src.bounded and records[-1].offset >= self._end[tp]:
                # Everything before the end offset has been returned now.
                records = [r for r in records if r.offset < self._end[tp]]
                self._positions[tp] = self._end[tp]
            else:
                self._positions[tp] = records[-1].offset + 1
            if records:
                out: list[Any] = []
                self._emit(tp, records, out)
                parts.append((tp, out))
        if src.bounded:
            await self._retire_finished(data)
        return parts

    def _emit(self, tp: Any, records: list[Any], out: list[Any]) -> None:
        loads, key_loads = self._loads, self._key_loads
        required = self._src.required
        try:
            values = [loads(r.value) for r in records]
        except Exception:  # some record is bad: take them one by one
            pass
        else:
            if not required or not required_violations(values, required):
                if key_loads is None:
                    out.extend(values)
                else:
                    keys = [None if r.key is None else key_loads(r.key) for r in records]
                    out.extend(zip(keys, values, strict=True))
                return
        dead_letter = self._ctx.dead_letter
        for r in records:
            raw = r.value if r.value is not None else b""
            origin = {"topic": tp.topic, "partition": tp.partition, "offset": r.offset}
            try:
                value = loads(r.value)
                event = (
                    value
                    if key_loads is None
                    else (None if r.key is None else key_loads(r.key), value)
                )
            except Exception as exc:  # any deserializer error is the record's, not ours
                dead_letter(raw, f"cannot deserialize: {type(exc).__name__}: {exc}", origin)
                continue
            problem = required_problem(value, required) if required else None
            if problem is not None:
                dead_letter(raw, problem, origin)
                continue
            out.append(event)

    async def _retire_finished(self, data: dict[Any, list[Any]]) -> None:
        """Drop partitions that reached their end offset from the active set.

        A partition with no records left may still be short of its end offset:
        the rest are transaction markers or aborted records, which the
        consumer skips. Its consumer position tells.
        """
        consumer = self._consumer
        finished = []
        for tp in self._active:
            end = self._end[tp]
            if self._positions[tp] < end and tp not in data:
                pos = await consumer.position(tp)
                if pos >= end:
                    self._positions[tp] = end
            if self._positions[tp] >= end:
                finished.append(tp)
        if finished:
            consumer.pause(*finished)
            self._active = [tp for tp in self._active if tp not in finished]

    # -- checkpoints ------------------------------------------------------------

    def snapshot_position(self) -> dict[str, int]:
        return {split_id(tp.topic, tp.partition): o for tp, o in self._positions.items()}

    def snapshot_position_for(self, checkpoint_id: int) -> dict[str, int]:
        """Take checkpoint ``checkpoint_id``'s positions; kept to commit to the group later."""
        if self._src.commits_offsets:
            if len(self._snapshots) >= _MAX_SNAPSHOTS:  # checkpoints not completing: drop oldest
                del self._snapshots[next(iter(self._snapshots))]
            self._snapshots[checkpoint_id] = dict(self._positions)
        return self.snapshot_position()

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Commit the completed checkpoint's offsets to the consumer group (monitoring only).

        Why: ``kafka-consumer-groups.sh --describe`` and lag exporters read a
        group's committed offsets; the job's own restore never does (it reads
        the checkpoint). The offsets are those of the newest checkpoint this
        reader snapshotted at or before ``checkpoint_id``, so the group never
        runs ahead of a completed checkpoint. A failed commit is logged and
        skipped: the next checkpoint's commit catches up.
        """
        done = [cid for cid in self._snapshots if cid <= checkpoint_id]
        if not done or self._consumer is None:
            return
        positions = self._snapshots[done[-1]]
        for cid in done:
            del self._snapshots[cid]
        if not positions:
            return
        try:
            await asyncio.wait_for(self._consumer.commit(positions), 10.0)
        except (kafka_errors.KafkaError, TimeoutError) as exc:
            log.warning(
                "%s: committing the offsets of checkpoint %d to group %s failed "
                "(monitoring only): %r",
                self._src.name,
                checkpoint_id,
                self._group,
                exc,
            )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for client in self._registries:
            await client.close()
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                await run_to_end(consumer.stop(), timeout_s=10.0)
            except (kafka_errors.KafkaError, TimeoutError) as exc:
                log.warning("%s: error while closing the consumer: %r", self._src.name, exc)
