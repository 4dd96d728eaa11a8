"""The Kafka sink's writers: exactly-once (two-phase commit over a producer pool) and at-least-once.

The protocol and the recovery rules are in :mod:`aiostream_ckpt.connectors.kafka.sink`;
the pool in :mod:`~aiostream_ckpt.connectors.kafka.pool`, ending transactions in
:mod:`~aiostream_ckpt.connectors.kafka.committer`.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiokafka import errors as kafka_errors

from aiostream_ckpt import failpoints
from aiostream_ckpt.connectors.base import (
    ConnectorContext,
    OutputSurvey,
    RecordErrorFn,
    duplicate_output_refusal,
    raise_record_error,
)
from aiostream_ckpt.connectors.held_output import HELD_KEY
from aiostream_ckpt.connectors.kafka.committer import (
    Committer,
    PendingTxn,
    ids_to_fence,
    owner_of,
)
from aiostream_ckpt.connectors.kafka.common import (
    bootstrap_client,
    connector_error,
    require_topics,
    run_to_end,
)
from aiostream_ckpt.connectors.kafka.encoder import RecordEncoder
from aiostream_ckpt.connectors.kafka.pool import (
    ProducerPool,
    Slot,
    SlotState,
    quietly,
    start_producer,
)
from aiostream_ckpt.connectors.kafka.savepoint_copy import (
    HeldRecord,
    HeldTransaction,
    read_copy,
    read_transaction,
    write_copy,
)
from aiostream_ckpt.connectors.kafka.security import merged_config
from aiostream_ckpt.connectors.kafka.transactions import prepared_transaction
from aiostream_ckpt.connectors.kafka.txn_admin import (
    OPEN_STATES,
    ListingUnsupportedError,
    list_transactional_ids,
)
from aiostream_ckpt.errors import ConnectorError, RestoreRefusedError, TransactionLostError

if TYPE_CHECKING:
    from aiostream_ckpt.connectors.kafka.sink import KafkaSink

log = logging.getLogger(__name__)

#: Share of the transaction timeout after which an open transaction is warned about.
_WARN_AT = 0.8


class _WriterBase(ABC):
    """Connection, topic check and delivery, shared by both semantics."""

    #: keep batches open across writes until full or the barrier (see ``encoder``)
    _hold_batches = False

    def __init__(self, sink: KafkaSink, ctx: ConnectorContext) -> None:
        self._sink = sink
        self._ctx = ctx
        #: the job's TLS/SASL settings (``kafka.*``) under the sink's own producer_config
        self._producer_config = merged_config(ctx.kafka_security, sink.producer_config)
        self._client: Any = None
        self._encoder: RecordEncoder | None = None
        self._recovered = False
        self._closed = False
        self._failure: ConnectorError | None = None
        self.records_written = 0
        #: see :class:`~aiostream_ckpt.connectors.base.RecordFunctions`
        self.record_failed: RecordErrorFn = raise_record_error

    @property
    def _label(self) -> str:
        return f"{self._sink.name}[{self._ctx.subtask_index}]"

    async def _connect(self) -> None:
        sink = self._sink
        self._client = await bootstrap_client(
            sink.bootstrap_servers,
            self._producer_config,
            timeout_s=sink.connect_timeout_s,
            what="sink metadata",
        )
        topics = await require_topics(
            self._client,
            [sink.topic],
            bootstrap_servers=sink.bootstrap_servers,
            clock=self._ctx.clock,
        )
        serializer, key_fn = await self._format_encoders()
        self._encoder = RecordEncoder(
            sink, topics[sink.topic], hold=self._hold_batches, serializer=serializer, key_fn=key_fn
        )

    async def _format_encoders(self) -> tuple[Any, Any]:
        """Return the value serializer and key function of the sink's formats (None: its own).

        Each format registers or looks up its schema once, here; the clients
        are closed after: a writer's schema id does not change while it runs.
        """
        sink = self._sink
        serializer: Any = None
        key_fn: Any = None
        clients: dict[Any, Any] = {}

        def client_of(registry: Any) -> Any:
            if registry not in clients:
                clients[registry] = registry.client()
            return clients[registry]

        try:
            if sink.value_format is not None:
                serializer = await sink.value_format.encoder(
                    client_of(sink.value_format.registry), sink.topic, is_key=False
                )
            if sink.key_format is not None:
                encode_key = await sink.key_format.encoder(
                    client_of(sink.key_format.registry), sink.topic, is_key=True
                )
                key_fn = _composed(encode_key, sink.key_fn)
        finally:
            for client in clients.values():
                await client.close()
        return serializer, key_fn

    async def _flush(self, producer: Any, what: str) -> None:
        """Wait for every batch sent on ``producer``; the first failure sticks."""
        assert self._encoder is not None
        try:
            await asyncio.wait_for(self._submit_and_flush(producer), self._sink.commit_timeout_s)
            self._encoder.check_delivered()
        except (kafka_errors.KafkaError, TimeoutError) as exc:
            raise self._fail(connector_error(f"{what}: flush", exc)) from exc
        except ConnectorError as exc:
            raise self._fail(exc) from exc

    async def _submit_and_flush(self, producer: Any) -> None:
        assert self._encoder is not None
        await self._encoder.submit_held(producer)
        await producer.flush()

    def _fail(self, exc: ConnectorError) -> ConnectorError:
        if self._failure is None:
            self._failure = exc
        return exc

    def _failed(self) -> ConnectorError | None:
        return self._failure

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if not self._recovered:
            raise ConnectorError(f"{self._label}: writer used before recover()")
        if self._closed:
            raise ConnectorError(f"{self._label}: writer used after close()")

    async def close(self) -> None:
        """Close once, to the end even if the task is cancelled meanwhile (``run_to_end``)."""
        if self._closed:
            return
        self._closed = True
        await run_to_end(self._close(), timeout_s=None)

    @abstractmethod
    async def _close(self) -> None:
        """Close what this semantics opened (producers, metadata client); once, from ``close``."""

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await quietly(client.close(), "closing the metadata client")


def _composed(encode_key: Any, user_key_fn: Any) -> Any:
    """``key_fn`` of a sink with a key format: the user's key, encoded."""

    def key_fn(record: Any) -> bytes:
        return encode_key(user_key_fn(record))  # type: ignore[no-any-return]

    key_fn.__qualname__ = getattr(user_key_fn, "__qualname__", "key_fn")  # errors name the user's
    return key_fn


class TransactionalKafkaWriter(_WriterBase):
    """Exactly-once writer of one subtask; see :mod:`aiostream_ckpt.connectors.kafka.sink`.

    Its batches stay open across writes (``KafkaSink(hold_batches=True)``):
    nothing of a transaction is visible before its commit, which follows the
    barrier's flush.
    """

    #: where the checkpointed output of *all* subtasks ends (see ``runtime.writer_state``)
    shared_state_keys = ("output_end",)

    def __init__(self, sink: KafkaSink, ctx: ConnectorContext) -> None:
        super().__init__(sink, ctx)
        self._hold_batches = sink.hold_batches
        self._base = sink.transactional_id_prefix or f"{ctx.job_name}-{ctx.operator_uid}"
        self._pool = ProducerPool(
            sink,
            f"{self._base}-{ctx.subtask_index}",
            sink.pool_size_for(ctx),
            label=self._label,
            on_failure=self._on_background_failure,
            producer_config=self._producer_config,
        )
        self._open: Slot | None = None
        self._pending: list[Slot] = []
        self._committer: Committer | None = None
        #: partition -> offset past the last record of the checkpointed output
        self._output_end: dict[int, int] = {}
        #: (transactional id, epoch) of a savepoint's own transaction (the fail point at its commit)
        self._held: set[tuple[str, int]] = set()
        #: a restored savepoint's copies to write in the first transaction: not in
        #: ``recover``, whose open transaction would hold back subtask 0's output check
        self._again: list[HeldRecord] = []

    @property
    def transactional_ids(self) -> list[str]:
        return self._pool.transactional_ids

    # -- recovery -------------------------------------------------------------

    def survey(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> OutputSurvey:
        """Say which newer checkpoints' committed transactions a restore would repeat.

        A committed transaction cannot be retracted, so the restore step
        refuses unless duplicates are allowed (see the output contract). A
        topic other than the restored state's is a fresh output; a state
        without a topic (older versions) counts as this topic.
        """
        topic = self._sink.topic
        restore = self._ctx.restore
        where = f"kafka topic {topic}"
        written = (restored or {}).get("topic", topic)
        if restore is None or not restore.newer or written != topic:
            return OutputSurvey(where, [], [], 0)
        newer = restore.newer
        span = (
            f"checkpoint {newer[0]}" if len(newer) == 1 else f"checkpoints {newer[0]}..{newer[-1]}"
        )
        kept = f"cannot retract committed Kafka transactions of {span} on topic {topic}"
        return OutputSurvey(where, [], [], 0, kept)

    async def recover(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> None:
        """Commit what the restored checkpoint lists, fence what an earlier run left, check."""
        await self._connect()
        committer = self._committer = Committer(
            self._sink, self._client, label=self._label, producer_config=self._producer_config
        )
        state = restored or {}
        pending = [PendingTxn.from_state(e) for e in state.get("pending", [])]
        unsure = await committer.commit_listed(pending)
        # Only now may InitProducerId run for these ids (see the sink's docstring).
        ctx = self._ctx
        try:
            listed = await list_transactional_ids(
                self._client, prefix=f"{self._base}-", states=OPEN_STATES
            )
        except ListingUnsupportedError as exc:
            log.warning(
                "%s: %s; only the ids the checkpoint knows are fenced (a run that died "
                "before its first checkpoint may leave transactions open until their timeout)",
                self._label,
                exc,
            )
            listed = []
        stale = ids_to_fence(
            state,
            listed,
            base=self._base,
            subtask=ctx.subtask_index,
            parallelism=ctx.parallelism,
            pool_size=len(self._pool.slots),
        )
        await asyncio.gather(committer.fence(stale), self._pool.start())
        lost = await committer.check_ended(
            [
                (entry, answer)
                for entry, answer in unsure
                if owner_of(entry.txn.transactional_id, self._base, ctx.parallelism)
                == ctx.subtask_index
            ],
            str(state.get("topic", self._sink.topic)),
        )
        self._again = self._from_savepoint_copies(lost, state)
        await self._check_output_end(state)
        self._recovered = True
        log.info(
            "%s: recovered from checkpoint %s; %d transactional producers %s-%d-0..%d ready",
            self._label,
            checkpoint_id,
            len(self._pool.slots),
            self._base,
            ctx.subtask_index,
            len(self._pool.slots) - 1,
        )

    def _from_savepoint_copies(
        self, lost: list[tuple[PendingTxn, str]], state: Mapping[str, Any]
    ) -> list[HeldRecord]:
        """Return the records of aborted transactions to write again from a savepoint's copies.

        Raises :class:`TransactionLostError` for a lost transaction no copy
        stands in for. A savepoint restored into another topic writes nothing
        of the old topic's (see :mod:`.savepoint_copy`).
        """
        if not lost:
            return []
        restore = self._ctx.restore
        if restore is None or restore.kind != "savepoint":
            raise TransactionLostError("; ".join(msg for _, msg in lost))
        copies = {h.key: h for h in map(HeldTransaction.from_state, state.get(HELD_KEY, []))}
        written = state.get("topic", self._sink.topic)
        records: list[HeldRecord] = []
        missing = []
        for entry, msg in sorted(lost, key=lambda e: e[0].checkpoint_id):
            txn = entry.txn
            copy = copies.get((txn.transactional_id, txn.producer_epoch))
            if written != self._sink.topic:
                log.warning(
                    "%s: savepoint %d's transaction %s on topic %s was aborted after the "
                    "savepoint (a restart of the job that took it, or its timeout); this "
                    "restore writes to topic %s from the savepoint's positions, so nothing "
                    "of it is written; %s",
                    self._label,
                    restore.checkpoint_id,
                    txn.transactional_id,
                    written,
                    self._sink.topic,
                    f"the savepoint holds its records in {copy.path}"
                    if copy is not None
                    else "the savepoint holds no copy of its records",
                )
                continue
            if copy is None:
                missing.append(f"{msg}; savepoint {restore.checkpoint_id} holds no copy of it")
                continue
            held = read_copy(Path(restore.path), copy)
            records += held
            log.info(
                "%s: transaction %s of savepoint %d was aborted after the savepoint; its %d "
                "record(s) are written again from the savepoint's copy %s",
                self._label,
                txn.transactional_id,
                restore.checkpoint_id,
                len(held),
                copy.path,
            )
        if missing:
            raise TransactionLostError("; ".join(missing))
        return records

    async def _write_again(self) -> None:
        """Write savepoint copies into the first transaction; the first checkpoint commits it.

        Called by the first write or barrier after the restore, when every
        task has recovered.
        """
        records, self._again = self._again, []
        assert self._encoder is not None
        slot = self._open or await self._begin()
        try:
            await self._encoder.send_as_they_were(
                slot.producer, [(p, k, v, h, t) for p, _, k, v, h, t in records]
            )
        except ConnectorError as exc:
            raise self._fail(exc) from exc

    async def _check_output_end(self, state: Mapping[str, Any]) -> None:
        """Refuse a restore whose topic has committed output newer than the restored state's.

        An older savepoint restored into a fresh checkpoint directory has no
        newer checkpoints to tell it that a later run went on writing: only the
        topic can. The state records where the checkpointed output of all
        subtasks ends per partition (``output_end``); a record that
        ``read_committed`` reads at or past it, once this job's transactions are
        fenced, was committed after the restore point and would be written
        again. Subtask 0 checks, for the whole sink. Flink cannot tell (its
        sink keeps no positions); we promise no duplicates, so we ask the topic.
        Not in a sharded job: there the other shards' records follow the output
        end too, so the check would refuse every restore of a shard.
        """
        assert self._committer is not None and self._encoder is not None
        ends = {int(p): int(o) for p, o in state.get("output_end", {}).items()}
        if not ends or state.get("topic", self._sink.topic) != self._sink.topic:
            # a fresh start, a new topic, or a state from before output_end: start here
            self._output_end = await self._committer.end_offsets(self._encoder.partitions)
            return
        self._output_end = ends
        restore = self._ctx.restore
        if self._ctx.subtask_index != 0 or restore is None or self._ctx.shard.sharded:
            # sharded: the other shards commit into the same partitions while this one
            # restores, and the topic cannot tell whose records are whose (their own
            # checkpoints' newer output is still refused: see ``survey``)
            return
        newer = await self._committer.committed_after(ends)
        if not newer:
            return
        kept = (
            f"kafka topic {self._sink.topic} holds records committed after the restored "
            "output ("
            + ", ".join(f"partition {p} from offset {o}" for p, o in sorted(newer.items()))
            + "), by a later run of this job or another writer of the topic"
        )
        if not restore.allow_duplicate_output:
            raise RestoreRefusedError(duplicate_output_refusal(restore.describe(), kept))
        log.warning(
            "%s: %s; their records are written again (--allow-duplicate-output): "
            "read_committed consumers see them twice",
            self._label,
            kept,
        )

    @staticmethod
    def merge_states(states: Sequence[Mapping[str, Any] | None]) -> dict[str, Any]:
        """Merge old instances' states for a restore at another parallelism.

        Committing a listed transaction is idempotent (EndTxn on a committed
        transaction succeeds), so every new instance may get every one. The
        output ends per partition are the furthest any instance reached.
        """
        pending: dict[str, list[Any]] = {}
        for state in states:
            for entry in (state or {}).get("pending", []):
                pending.setdefault(f"{entry[1]}/{entry[2]}/{entry[3]}", list(entry))
        topics = [s["topic"] for s in states if s and "topic" in s]
        held: dict[str, list[Any]] = {}
        for state in states:
            for row in (state or {}).get(HELD_KEY, []):
                held.setdefault(f"{row[0]}/{row[1]}", list(row))
        ends: dict[str, int] = {}
        for state in states:
            for p, end in (state or {}).get("output_end", {}).items():
                ends[p] = max(ends.get(p, 0), int(end))
        return {
            "pending": sorted(pending.values(), key=lambda e: int(e[0])),
            **({"output_end": ends} if ends else {}),
            "pools": {str(i): int(s.get("pool_size", 0)) for i, s in enumerate(states) if s},
            **({"topic": topics[0]} if topics else {}),
            **({HELD_KEY: list(held.values())} if held else {}),
        }

    # -- writing --------------------------------------------------------------

    async def write(self, batch: list[Any]) -> None:
        if not batch:
            return
        self._check_usable()
        if self._again:
            await self._write_again()
        slot = self._open or await self._begin()
        assert self._encoder is not None
        self.records_written += await self._encoder.send(slot.producer, batch, self.record_failed)

    async def _begin(self) -> Slot:
        try:
            slot = await self._pool.acquire(self._failed)
        except ConnectorError as exc:
            raise self._fail(exc) from exc
        try:
            await slot.producer.begin_transaction()
        except kafka_errors.KafkaError as exc:
            raise self._fail(connector_error(f"{slot.transactional_id}: begin", exc)) from exc
        slot.advance(SlotState.OPEN)
        slot.opened_at = self._ctx.clock.monotonic()
        self._open = slot
        return slot

    # -- what is open, for operators (REST, metrics, the age warning) -----------

    def transactions(self) -> list[dict[str, Any]]:
        """Open and pre-committed transactions of this subtask, oldest first."""
        now = self._ctx.clock.monotonic()
        rows = []
        for slot in self._pool.slots:
            if slot.opened_at is None or slot.state not in (SlotState.OPEN, SlotState.PRECOMMITTED):
                continue
            prepared = slot.prepared
            rows.append(
                {
                    "transactional_id": slot.transactional_id,
                    "state": slot.state.value,
                    "checkpoint_id": slot.checkpoint_id if prepared else None,
                    "producer_id": prepared.producer_id if prepared else None,
                    "producer_epoch": prepared.producer_epoch if prepared else None,
                    "age_seconds": round(now - slot.opened_at, 3),
                    "timeout_seconds": self._sink.transaction_timeout_ms / 1000,
                }
            )
        return sorted(rows, key=lambda r: -r["age_seconds"])

    def oldest_transaction_age(self) -> float:
        """Seconds the oldest open or pre-committed transaction has run (0 when none)."""
        now = self._ctx.clock.monotonic()
        ages = [
            now - s.opened_at
            for s in self._pool.slots
            if s.opened_at is not None and s.state in (SlotState.OPEN, SlotState.PRECOMMITTED)
        ]
        return max(ages, default=0.0)

    def check_transaction_ages(self) -> None:
        """Log a WARNING, once per transaction, past 80 % of ``transaction_timeout_ms``.

        The broker aborts a transaction at its timeout; a pre-committed one
        then loses its records if this job dies before committing it.
        """
        limit = self._sink.transaction_timeout_ms / 1000
        now = self._ctx.clock.monotonic()
        for slot in self._pool.slots:
            if slot.opened_at is None or slot.warned:
                continue
            if slot.state not in (SlotState.OPEN, SlotState.PRECOMMITTED):
                continue
            age = now - slot.opened_at
            if age >= _WARN_AT * limit:
                slot.warned = True
                log.warning(
                    "%s: transaction %s (%s, checkpoint %s) has been open %.0f s of its "
                    "transaction_timeout_ms %.0f s: the broker aborts it then; checkpoints "
                    "are not completing",
                    self._label,
                    slot.transactional_id,
                    slot.state.value,
                    slot.checkpoint_id if slot.prepared else "-",
                    age,
                    limit,
                )

    # -- two-phase commit -----------------------------------------------------

    async def prepare_commit(self, checkpoint_id: int) -> dict[str, Any]:
        """Flush the open transaction and list it (with all still pending) in the state."""
        self._check_usable()
        if self._again:
            await self._write_again()
        if self._pending and self._pending[-1].checkpoint_id >= checkpoint_id:
            raise ConnectorError(
                f"{self._label}: prepare_commit({checkpoint_id}) after "
                f"prepare_commit({self._pending[-1].checkpoint_id})"
            )
        slot, self._open = self._open, None
        if slot is not None:
            assert self._encoder is not None
            await self._flush(slot.producer, slot.transactional_id)
            slot.prepared = prepared_transaction(slot.producer)
            slot.ranges = self._encoder.take_ranges()
            for p, (_, last) in slot.ranges.items():
                self._output_end[p] = max(self._output_end.get(p, 0), last + 1)
            slot.checkpoint_id = checkpoint_id
            slot.advance(SlotState.PRECOMMITTED)
            self._pending.append(slot)
        return self.state()

    def state(self) -> dict[str, Any]:
        """Writer state: ``[checkpoint, id, producer id, epoch, offsets]`` per pending txn.

        ``prefix`` (the ids' base) lets ``aiostream-ckpt transactions`` find
        the job's transactions on the broker from the checkpoint alone.
        """
        return {
            "pending": [
                PendingTxn(s.checkpoint_id, s.prepared, s.ranges).to_state()
                for s in self._pending
                if s.prepared
            ],
            "pool_size": len(self._pool.slots),
            "prefix": self._base,
            "topic": self._sink.topic,
            "output_end": {str(p): end for p, end in sorted(self._output_end.items())},
        }

    async def hold_for_savepoint(
        self, checkpoint_id: int, state: dict[str, Any], directory: Path, root: Path
    ) -> dict[str, Any]:
        """Keep a copy of every pre-committed transaction ``state`` lists, in the savepoint.

        Read back from the topic (see :mod:`.savepoint_copy`) into ``directory``
        inside the savepoint ``root``; the returned state names the copies.
        """
        self._check_usable()
        held = []
        for entry in map(PendingTxn.from_state, state.get("pending", [])):
            if entry.ranges is None:
                continue  # no offsets to read it back by (a state of older versions)
            txn = entry.txn
            records = await read_transaction(
                self._client,
                self._sink.topic,
                txn.producer_id,
                txn.producer_epoch,
                entry.ranges,
                timeout_s=self._sink.commit_timeout_s,
            )
            name = f"{txn.transactional_id}-{txn.producer_epoch}.records"
            tid, epoch = txn.transactional_id, txn.producer_epoch
            copy = await asyncio.to_thread(write_copy, records, directory, name, root, tid, epoch)
            held.append(copy.to_state())
            if entry.checkpoint_id == checkpoint_id:  # see StagedFileWriter.hold_for_savepoint
                self._held.add(copy.key)
        return {**state, HELD_KEY: held} if held else state

    async def commit(self, checkpoint_id: int) -> None:
        """Commit every pre-committed transaction up to ``checkpoint_id``; idempotent."""
        if self._failure is not None:
            raise self._failure
        assert self._committer is not None
        for slot in [s for s in self._pending if s.checkpoint_id <= checkpoint_id]:
            try:
                await self._committer.commit_slot(slot)
            except ConnectorError as exc:
                raise self._fail(exc) from exc
            slot.advance(SlotState.COMMITTED)
            failpoints.hit("sink_commit")
            held = (slot.transactional_id, slot.prepared.producer_epoch) if slot.prepared else None
            if held in self._held:
                self._held.discard(held)
                failpoints.hit("savepoint_output_commit")
            self._pending.remove(slot)
            self._pool.recycle(slot)

    def _on_background_failure(self, exc: BaseException) -> None:
        self._fail(
            exc
            if isinstance(exc, ConnectorError)
            else ConnectorError(f"{self._label}: {exc!r}", retriable=True)
        )

    async def _close(self) -> None:
        """Abort the open transaction (no checkpoint covers it); keep pre-committed ones.

        A pre-committed transaction's checkpoint may have completed: the next
        recovery commits or fences it, so closing must not abort it.
        """
        slot, self._open = self._open, None
        await self._pool.close(slot)
        if slot is not None and self._encoder is not None:
            self._encoder.reset()
        await self._close_client()


class AtLeastOnceKafkaWriter(_WriterBase):
    """One idempotent producer; flushed at every barrier, so nothing acked is lost."""

    def __init__(self, sink: KafkaSink, ctx: ConnectorContext) -> None:
        super().__init__(sink, ctx)
        self._producer: Any = None

    @staticmethod
    def merge_states(states: Sequence[Mapping[str, Any] | None]) -> dict[str, Any]:
        return {}

    async def recover(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> None:
        await self._connect()
        self._producer = await start_producer(self._sink, None, self._producer_config)
        self._recovered = True

    async def write(self, batch: list[Any]) -> None:
        if not batch:
            return
        self._check_usable()
        assert self._encoder is not None
        self.records_written += await self._encoder.send(self._producer, batch, self.record_failed)

    async def prepare_commit(self, checkpoint_id: int) -> dict[str, Any]:
        self._check_usable()
        await self._flush(self._producer, self._label)
        assert self._encoder is not None
        self._encoder.take_ranges()
        return {}

    async def commit(self, checkpoint_id: int) -> None:
        return None

    async def _close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await quietly(producer.stop(), "stopping the producer")
        await self._close_client()
