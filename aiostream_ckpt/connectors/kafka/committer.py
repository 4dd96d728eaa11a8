"""Commit pre-committed Kafka transactions, live and on recovery; fence what an earlier run left.

Recovery, in this order (each step's reason is in
:mod:`aiostream_ckpt.connectors.kafka.sink`):

1. Commit, by EndTxn with the stored id and epoch, every transaction the
   restored checkpoint lists. Before any InitProducerId for these ids.
2. Fence every transactional id an earlier run may have used and this
   subtask is responsible for: its own slots (by starting them), slots beyond
   a pool that shrank, the slots of old subtasks at or above the new
   parallelism (subtask 0), and whatever open transaction the broker lists
   under the sink's prefix outside the new run's slots (a run that never
   reached a checkpoint leaves no trace in it).
3. A listed transaction whose EndTxn answered that it had already ended is
   checked against the output: its stored offsets are read with
   ``read_committed``. Committed before the crash -> fine; aborted (the job
   was down longer than the transaction timeout) -> :class:`TransactionLostError`
   naming the checkpoint, the id and the lost offsets, unless a savepoint is
   restored that holds a copy of it (:mod:`.savepoint_copy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka import errors as kafka_errors

from aiostream_ckpt.connectors.kafka.common import bootstrap_to_end, client_kwargs, run_to_end
from aiostream_ckpt.connectors.kafka.transactions import (
    EndTxnOutcome,
    PreparedTransaction,
    end_prepared_transaction,
)
from aiostream_ckpt.connectors.kafka.txn_admin import fence_transactional_id
from aiostream_ckpt.errors import ConnectorError

if TYPE_CHECKING:
    from aiostream_ckpt.connectors.kafka.encoder import OffsetRanges
    from aiostream_ckpt.connectors.kafka.pool import Slot
    from aiostream_ckpt.connectors.kafka.sink import KafkaSink

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PendingTxn:
    """One pre-committed transaction as the writer state lists it."""

    checkpoint_id: int
    txn: PreparedTransaction
    #: Per partition ``[first, last]`` offset; ``None`` in states written before offsets were.
    ranges: OffsetRanges | None = field(default=None)

    def to_state(self) -> list[Any]:
        ranges = {str(p): r for p, r in sorted((self.ranges or {}).items())}
        return [self.checkpoint_id, *self.txn, ranges]

    @classmethod
    def from_state(cls, entry: list[Any]) -> PendingTxn:
        txn = PreparedTransaction(str(entry[1]), int(entry[2]), int(entry[3]))
        ranges = (
            {int(p): [int(a), int(b)] for p, (a, b) in entry[4].items()} if len(entry) > 4 else None
        )
        return cls(int(entry[0]), txn, ranges)


def owner_of(transactional_id: str, base: str, parallelism: int) -> int:
    """Return the new subtask that answers for ``{base}-{subtask}-{slot}`` (0 for any other id)."""
    m = re.fullmatch(re.escape(base) + r"-(\d+)-(\d+)", transactional_id)
    sub = int(m.group(1)) if m is not None else 0
    return sub if sub < parallelism else 0


def ids_to_fence(
    state: Mapping[str, Any],
    listed_open: Iterable[str],
    *,
    base: str,
    subtask: int,
    parallelism: int,
    pool_size: int,
) -> list[str]:
    """Old transactional ids outside this subtask's pool that this subtask must fence.

    From the checkpoint: slots beyond a pool that shrank and (subtask 0) every
    slot of an old subtask at or above the new parallelism. From the broker
    (``listed_open``): any open transaction under ``base`` that is neither in
    a live slot of the new run nor another subtask's to fence.
    """
    own = f"{base}-{subtask}"
    pools = {int(k): int(v) for k, v in state.get("pools", {}).items()}
    own_before = int(state.get("pool_size", pools.get(subtask, 0)))
    ids = {f"{own}-{i}" for i in range(pool_size, own_before)}
    if subtask == 0:
        for old, size in pools.items():
            if old >= parallelism:
                ids.update(f"{base}-{old}-{i}" for i in range(size))
    for txn_id in listed_open:
        m = re.fullmatch(re.escape(base) + r"-(\d+)-(\d+)", txn_id)
        if m is None:
            continue
        sub, slot = int(m.group(1)), int(m.group(2))
        if (sub == subtask and slot >= pool_size) or (sub >= parallelism and subtask == 0):
            ids.add(txn_id)
    return sorted(ids)


class Committer:
    """Ends transactions for one writer through its bootstrapped client."""

    def __init__(
        self,
        sink: KafkaSink,
        client: Any,
        *,
        label: str,
        producer_config: dict[str, Any] | None = None,
    ) -> None:
        self._sink = sink
        self._client = client
        self._label = label
        #: the sink's producer config over the job's TLS/SASL (its check consumers use it)
        self._producer_config = producer_config if producer_config is not None else {}

    async def commit_listed(self, pending: list[PendingTxn]) -> list[tuple[PendingTxn, str]]:
        """EndTxn(commit) each; return those that had already ended, with the broker's answer."""
        unsure: list[tuple[PendingTxn, str]] = []
        for entry in pending:
            txn = entry.txn
            outcome = await end_prepared_transaction(
                self._client, txn, commit=True, timeout_s=self._sink.commit_timeout_s
            )
            if outcome is EndTxnOutcome.COMPLETED:
                log.info(
                    "%s: committed transaction %s (epoch %d) of checkpoint %d on recovery",
                    self._label,
                    txn.transactional_id,
                    txn.producer_epoch,
                    entry.checkpoint_id,
                )
            else:
                unsure.append((entry, outcome.value))
        return unsure

    async def fence(self, transactional_ids: list[str]) -> None:
        """Abort whatever these ids hold open and fence their producers, concurrently."""
        await asyncio.gather(
            *(
                fence_transactional_id(
                    self._client,
                    t,
                    transaction_timeout_ms=self._sink.transaction_timeout_ms,
                    timeout_s=self._sink.commit_timeout_s,
                )
                for t in transactional_ids
            )
        )
        if transactional_ids:
            log.info(
                "%s: fenced %d transactional ids an earlier run left: %s",
                self._label,
                len(transactional_ids),
                ", ".join(transactional_ids),
            )

    async def check_ended(
        self, unsure: list[tuple[PendingTxn, str]], topic: str
    ) -> list[tuple[PendingTxn, str]]:
        """Return each ended transaction not in ``topic``, with why its records are lost.

        ``topic``: the one the transactions wrote (the restored state's; a
        savepoint may be restored into another).

        Run after fencing: the read waits for the partitions' last stable
        offset to pass the stored range. The caller raises
        :class:`TransactionLostError` for those it cannot bring back (a
        savepoint holds a copy of its transactions: the writer writes it again).
        """
        lost = []
        for entry, answer in unsure:
            if entry.ranges is None:
                log.warning(
                    "%s: transaction %s of checkpoint %d already ended (%s) and its state "
                    "has no offsets to check it against: committed before the restart, "
                    "or aborted by the transaction timeout",
                    self._label,
                    entry.txn.transactional_id,
                    entry.checkpoint_id,
                    answer,
                )
                continue
            if answer != EndTxnOutcome.INVALID_STATE.value and await self._visible(entry, topic):
                log.info(
                    "%s: transaction %s of checkpoint %d was committed before the restart",
                    self._label,
                    entry.txn.transactional_id,
                    entry.checkpoint_id,
                )
                continue
            lost.append((entry, self._lost_message(entry, answer, topic)))
        return lost

    def _lost_message(self, entry: PendingTxn, answer: str, topic: str) -> str:
        txn = entry.txn
        spans = ", ".join(
            f"{topic}[{p}] offsets {a}..{b}" for p, (a, b) in sorted((entry.ranges or {}).items())
        )
        return (
            f"{self._label}: checkpoint {entry.checkpoint_id} completed, but its Kafka "
            f"transaction {txn.transactional_id} (producer id {txn.producer_id}, epoch "
            f"{txn.producer_epoch}) was aborted before recovery could commit it "
            f"(EndTxn answered {answer}); the records it wrote are lost: {spans}. "
            "The job was down longer than the transaction timeout: raise "
            f"KafkaSink(transaction_timeout_ms=...) (now {self._sink.transaction_timeout_ms} ms) "
            "and the broker's transaction.max.timeout.ms, which caps it"
        )

    @contextlib.asynccontextmanager
    async def _consumer(self) -> AsyncIterator[Any]:
        """Start a ``read_committed`` consumer for the block, stop it on the way out.

        Stopped also after a failed start, and to its end even if cancelled
        (aiokafka's second ``stop()`` returns at once, leaving sockets open).
        """
        consumer = self._new_consumer()
        try:
            await consumer.start()
            yield consumer
        finally:
            await run_to_end(consumer.stop(), timeout_s=None)

    def _new_consumer(self) -> Any:
        return bootstrap_to_end(
            AIOKafkaConsumer(
                bootstrap_servers=self._sink.bootstrap_servers,
                isolation_level="read_committed",
                enable_auto_commit=False,
                auto_offset_reset="none",
                **client_kwargs(self._producer_config),
            )
        )

    async def _visible(self, entry: PendingTxn, topic: str) -> bool:
        """Whether ``read_committed`` can read the first record of ``entry`` in ``topic``."""
        assert entry.ranges is not None
        async with self._consumer() as consumer:
            partition, (first, last) = min(entry.ranges.items())
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            consumer.seek(tp, first)
            deadline = time.monotonic() + self._sink.commit_timeout_s
            while time.monotonic() < deadline:
                try:
                    got = await consumer.getmany(tp, timeout_ms=200, max_records=1)
                except kafka_errors.OffsetOutOfRangeError:
                    log.warning(
                        "%s: offsets of transaction %s were deleted (retention): not checked",
                        self._label,
                        entry.txn.transactional_id,
                    )
                    return True
                records = got.get(tp, [])
                if records:
                    return bool(records[0].offset <= last)
                if await consumer.position(tp) > last:
                    return False
            raise self._held_back(
                f"check transaction {entry.txn.transactional_id} of checkpoint "
                f"{entry.checkpoint_id}",
                tp,
            )

    async def end_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        """Return the log end offset (high watermark) of each of the topic's ``partitions``."""
        async with self._consumer() as consumer:
            tps = [TopicPartition(self._sink.topic, p) for p in partitions]
            consumer.assign(tps)
            await consumer.seek_to_end(*tps)
            return {tp.partition: await consumer.position(tp) for tp in tps}

    async def committed_after(self, ends: Mapping[int, int]) -> dict[int, int]:
        """Partition -> first offset at or after ``ends[p]`` that ``read_committed`` can read.

        What an earlier run committed past the restored checkpoint's output.
        Run after fencing: every open transaction of this sink has been
        aborted, so the read reaches the partitions' end; control records and
        aborted records are skipped by the consumer.
        """
        async with self._consumer() as consumer:
            tps = {TopicPartition(self._sink.topic, p): end for p, end in ends.items()}
            consumer.assign(list(tps))
            for tp, end in tps.items():
                consumer.seek(tp, end)
            todo = dict(tps)
            found: dict[int, int] = {}
            deadline = time.monotonic() + self._sink.commit_timeout_s
            while todo:
                if time.monotonic() > deadline:
                    raise self._held_back("check the output after the restore point", *todo)
                try:
                    got = await consumer.getmany(*todo, timeout_ms=200, max_records=1)
                except kafka_errors.OffsetOutOfRangeError:
                    log.warning(
                        "%s: output past the restore point was deleted (retention): not checked",
                        self._label,
                    )
                    return found
                for tp, records in got.items():
                    if records:
                        found[tp.partition] = records[0].offset
                        del todo[tp]
                for tp in list(todo):
                    high = consumer.highwater(tp)
                    if high is not None and await consumer.position(tp) >= high:
                        del todo[tp]
            return found

    def _held_back(self, what: str, *tps: TopicPartition) -> ConnectorError:
        where = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in tps)
        return ConnectorError(
            f"{self._label}: cannot {what}: {where} stays held back by an open transaction "
            f"for {self._sink.commit_timeout_s:g}s",
            retriable=True,
        )

    async def commit_slot(self, slot: Slot) -> None:
        """Commit ``slot``'s pre-committed transaction through its producer, else by EndTxn."""
        assert slot.prepared is not None
        try:
            await asyncio.wait_for(slot.producer.commit_transaction(), self._sink.commit_timeout_s)
            return
        except kafka_errors.ProducerFenced as exc:
            raise self.fenced(slot) from exc
        except Exception as exc:  # the producer is unusable; the stored id and epoch aren't
            log.warning(
                "%s: commit of %s through its producer failed (%r); resuming it by EndTxn",
                self._label,
                slot.transactional_id,
                exc,
            )
        outcome = await end_prepared_transaction(
            self._client, slot.prepared, commit=True, timeout_s=self._sink.commit_timeout_s
        )
        if outcome is EndTxnOutcome.FENCED:
            raise self.fenced(slot)
        if outcome is not EndTxnOutcome.COMPLETED:
            raise ConnectorError(
                f"{self._label}: transaction {slot.transactional_id} of checkpoint "
                f"{slot.checkpoint_id} cannot be committed: {outcome.value}",
                retriable=False,
            )

    def fenced(self, slot: Slot) -> ConnectorError:
        return ConnectorError(
            f"{self._label}: producer {slot.transactional_id} was fenced: another instance "
            "of this sink took over (zombie writer)",
            retriable=False,
        )
