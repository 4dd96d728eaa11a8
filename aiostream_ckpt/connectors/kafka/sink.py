"""Kafka sink: exactly-once by two-phase commit over a pool of transactional producers.

The protocol (Flink's ``KafkaSink``, in aiokafka):

- Records of epoch n (between barriers n-1 and n) go into transaction n, open
  on one producer of a small per-subtask pool with stable transactional ids
  ``{prefix}-{subtask}-{slot}``.
- At barrier n, :meth:`TransactionalKafkaWriter.prepare_commit` flushes and
  records ``(checkpoint, transactional id, producer id, epoch)`` in the writer
  state of checkpoint n. The state lists *every* pre-committed transaction not
  yet committed (an aborted checkpoint's transaction is committed with the next
  one). Epoch n+1 opens on another slot: a producer holds one open transaction
  at a time, and n waits there for its commit.
- On checkpoint-complete n, every pre-committed transaction up to n is
  committed through its live producer (falling back to a bare ``EndTxn`` with
  the stored id and epoch if that producer failed).

**Recovery: approach (a), resume and commit.** If the process dies after
checkpoint n's metadata is durable but before transaction n commits, n's
records precede the checkpointed source offsets and are never replayed, so
the restarted writer must commit transaction n itself. It sends EndTxn(commit)
with the stored producer id and epoch
(:func:`~aiostream_ckpt.connectors.kafka.transactions.end_prepared_transaction`),
*before* any producer of this subtask calls InitProducerId, since that would
bump the epoch and abort the very transaction. Only then does it start a
producer on every slot: InitProducerId fences zombies and aborts whatever they
left open (transactions of checkpoints that never completed). We chose this
over (b), a write-ahead copy of each epoch's output in the checkpoint: (a)
keeps checkpoints small and output written once, and the broker behaviour it
needs is pinned by ``tests/integration/kafka/test_broker_transactions.py``.
Its conditions: the restart must come before ``transaction_timeout_ms`` (1 h
by default, Flink's advice; the broker's ``transaction.max.timeout.ms`` must
allow it), and transactional ids must not be shared with another job.

**One producer instance per transaction.** aiokafka speaks EndTxn v0, so the
broker never bumps the epoch between transactions of one producer. If a slot
ran transaction n+2 with the epoch of n, a recovery commit of n would commit
n+2's uncheckpointed records. So a slot's producer is replaced (new
InitProducerId, new epoch) right after each commit, in the background: a
stored ``(id, epoch)`` names exactly one transaction, and a recovery EndTxn
for a transaction whose slot moved on answers FENCED ("already ended"),
never touching newer data.

**Pool sizing.** ``pool_size`` defaults to 3, that is max concurrent
checkpoints (1) + 2: the open transaction, the pre-committed one awaiting its
checkpoint, and the one whose checkpoint completed but whose commit
notification hasn't run yet when the next barrier arrives. When aborted
checkpoints leave more pre-committed transactions than that, :meth:`write`
waits for a commit to free a slot (backpressure, bounded by
``slot_wait_timeout_s``). This never deadlocks: every pre-committed
transaction's checkpoint was already acknowledged by this writer.

``at_least_once``: one idempotent, non-transactional producer, flushed at the
barrier; a replay after a failure may repeat records, never lose them.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors
from aiokafka.partitioner import DefaultPartitioner

from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.kafka.common import (
    bootstrap_client,
    check_bootstrap_servers,
    connector_error,
    require_topics,
    start_with_deadline,
)
from aiostream_ckpt.connectors.kafka.transactions import (
    EndTxnOutcome,
    PreparedTransaction,
    end_prepared_transaction,
    prepared_transaction,
)
from aiostream_ckpt.errors import ConfigError, ConnectorError

log = logging.getLogger(__name__)

Serializer = Callable[[Any], bytes]
KeyFn = Callable[[Any], bytes | str | None]
HeadersFn = Callable[[Any], Iterable[tuple[str, bytes]] | None]

DEFAULT_POOL_SIZE = 3
#: Larger than aiokafka's 16 KiB default: batches are built here, a write at a time.
_MAX_BATCH_SIZE = 512 * 1024
_KEY_CACHE_MAX = 100_000


class TxnState(enum.Enum):
    """Lifecycle of one pool slot: one producer instance, at most one transaction."""

    STARTING = "starting"  # producer (re)starting: InitProducerId in flight
    IDLE = "idle"
    OPEN = "open"
    PRECOMMITTED = "precommitted"
    COMMITTED = "committed"
    ABORTED = "aborted"


_TRANSITIONS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.STARTING: frozenset({TxnState.IDLE}),
    TxnState.IDLE: frozenset({TxnState.OPEN}),
    TxnState.OPEN: frozenset({TxnState.PRECOMMITTED, TxnState.ABORTED}),
    TxnState.PRECOMMITTED: frozenset({TxnState.COMMITTED}),
    TxnState.COMMITTED: frozenset({TxnState.STARTING}),
    TxnState.ABORTED: frozenset({TxnState.STARTING}),
}


@dataclass(slots=True)
class _Slot:
    index: int
    transactional_id: str
    state: TxnState = TxnState.STARTING
    producer: Any = None
    checkpoint_id: int = -1
    prepared: PreparedTransaction | None = None

    def advance(self, new: TxnState) -> None:
        if new not in _TRANSITIONS[self.state]:
            raise AssertionError(f"{self.transactional_id}: {self.state.value} -> {new.value}")
        self.state = new


class KafkaSink:
    """Writes records to ``topic``; exactly-once (transactions) or at-least-once.

    ``serializer(record) -> bytes`` makes the value; ``key_fn(record)`` the key
    (records with one key go to one partition, in order; default partitioner
    murmur2, as the Java client); ``headers_fn(record)`` a list of ``(str,
    bytes)`` headers. ``producer_config`` is passed to ``AIOKafkaProducer``
    (TLS, SASL, compression). ``transactional_id_prefix`` defaults to
    ``{job name}-{operator uid}``; two jobs writing to one cluster must not
    share it. See the module docstring for ``pool_size`` and recovery.
    """

    def __init__(
        self,
        topic: str,
        bootstrap_servers: str,
        *,
        semantic: Literal["exactly_once", "at_least_once"] = "exactly_once",
        key_fn: KeyFn | None = None,
        headers_fn: HeadersFn | None = None,
        serializer: Serializer = orjson.dumps,
        producer_config: dict[str, Any] | None = None,
        transactional_id_prefix: str | None = None,
        pool_size: int | None = None,
        transaction_timeout_ms: int = 3_600_000,
        connect_timeout_s: float = 30.0,
        commit_timeout_s: float = 60.0,
        slot_wait_timeout_s: float = 600.0,
        name: str = "kafka-sink",
    ) -> None:
        if not topic:
            raise ConfigError("KafkaSink needs a topic")
        if semantic not in ("exactly_once", "at_least_once"):
            raise ConfigError(f"semantic must be exactly_once or at_least_once: {semantic!r}")
        if pool_size is not None and pool_size < 2:
            raise ConfigError(f"pool_size must be at least 2, got {pool_size}")
        if transaction_timeout_ms < 1000 or connect_timeout_s <= 0 or commit_timeout_s <= 0:
            raise ConfigError("transaction timeout >= 1000 ms and positive timeouts required")
        if producer_config and "transactional_id" in producer_config:
            raise ConfigError("set transactional_id_prefix, not producer_config transactional_id")
        self.topic = topic
        self.bootstrap_servers = check_bootstrap_servers(bootstrap_servers)
        self.semantic = semantic
        self.key_fn = key_fn
        self.headers_fn = headers_fn
        self.serializer = serializer
        self.producer_config = dict(producer_config or {})
        self.transactional_id_prefix = transactional_id_prefix
        self.pool_size = pool_size or DEFAULT_POOL_SIZE
        self.transaction_timeout_ms = transaction_timeout_ms
        self.connect_timeout_s = connect_timeout_s
        self.commit_timeout_s = commit_timeout_s
        self.slot_wait_timeout_s = slot_wait_timeout_s
        self.name = name

    def create_writer(
        self, ctx: ConnectorContext
    ) -> TransactionalKafkaWriter | AtLeastOnceKafkaWriter:
        if self.semantic == "exactly_once":
            return TransactionalKafkaWriter(self, ctx)
        return AtLeastOnceKafkaWriter(self, ctx)


class _Encoder:
    """Turns records into per-partition batches on one producer; tracks their delivery."""

    def __init__(self, sink: KafkaSink, partitions: list[int]) -> None:
        self._topic = sink.topic
        self._dumps = sink.serializer
        self._key_fn = sink.key_fn
        self._headers_fn = sink.headers_fn
        self._partitions = partitions
        self._partitioner = DefaultPartitioner()
        self._key_partition: dict[bytes, int] = {}
        self._round_robin = 0
        self._pending: list[asyncio.Future[Any]] = []

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

    async def send(self, producer: Any, batch: list[Any]) -> int:
        """Append ``batch`` to per-partition builders; submit each when full and at the end.

        The per-record loop is the sink's hot path (measured): cached key ->
        partition lookups inline, no per-record method calls beyond the user's.
        """
        dumps, key_fn, headers_fn = self._dumps, self._key_fn, self._headers_fn
        cache = self._key_partition
        builders: dict[int, Any] = {}
        self._round_robin += 1
        for record in batch:
            value = dumps(record)
            key: Any = None
            p: int | None = None
            if key_fn is not None:
                key = key_fn(record)
                if key.__class__ is str:
                    key = key.encode()
                p = cache.get(key) if key is not None else None
            if p is None:
                p = self._partition(key)
            headers = None if headers_fn is None else list(headers_fn(record) or ())
            builder = builders.get(p)
            if builder is None:
                builder = builders[p] = producer.create_batch()
            if builder.append(timestamp=None, key=key, value=value, headers=headers) is None:
                await self._submit(producer, builder, p)
                builder = builders[p] = producer.create_batch()
                if builder.append(timestamp=None, key=key, value=value, headers=headers) is None:
                    raise ConnectorError(
                        f"record of {len(value)} bytes does not fit in a Kafka batch "
                        "(raise max_batch_size in producer_config)",
                        retriable=False,
                    )
        for p, builder in builders.items():
            if builder.record_count():
                await self._submit(producer, builder, p)
        return len(batch)

    async def _submit(self, producer: Any, builder: Any, partition: int) -> None:
        try:
            fut = await producer.send_batch(builder, self._topic, partition=partition)
        except kafka_errors.KafkaError as exc:
            raise connector_error(f"send to {self._topic}[{partition}] failed", exc) from exc
        self._pending.append(fut)
        if len(self._pending) > 1024:
            self.check_delivered(done_only=True)

    def check_delivered(self, *, done_only: bool = False) -> None:
        """Raise the first delivery failure; forget delivered batches."""
        still = []
        for fut in self._pending:
            if not fut.done():
                if done_only:
                    still.append(fut)
                    continue
                raise ConnectorError("a Kafka batch was not delivered by flush()", retriable=True)
            exc = fut.exception()
            if exc is not None:
                self._pending = []
                raise connector_error(f"delivery to {self._topic} failed", exc) from exc
        self._pending = still

    def reset(self) -> None:
        """Forget batches of an aborted transaction."""
        self._pending = []


class _WriterBase:
    """Connection, topic check and producers, shared by both semantics."""

    def __init__(self, sink: KafkaSink, ctx: ConnectorContext) -> None:
        self._sink = sink
        self._ctx = ctx
        self._client: Any = None
        self._encoder: _Encoder | None = None
        self._recovered = False
        self._closed = False
        self._failure: ConnectorError | None = None
        self.records_written = 0

    @property
    def _label(self) -> str:
        return f"{self._sink.name}[{self._ctx.subtask_index}]"

    async def _connect(self) -> None:
        sink = self._sink
        self._client = await bootstrap_client(
            sink.bootstrap_servers,
            sink.producer_config,
            timeout_s=sink.connect_timeout_s,
            what="sink metadata",
        )
        topics = await require_topics(
            self._client, [sink.topic], bootstrap_servers=sink.bootstrap_servers
        )
        self._encoder = _Encoder(sink, topics[sink.topic])

    async def _start_producer(self, transactional_id: str | None) -> Any:
        sink = self._sink
        config: dict[str, Any] = {
            "acks": "all",
            "enable_idempotence": True,
            "max_batch_size": _MAX_BATCH_SIZE,
            **sink.producer_config,
        }
        if transactional_id is not None:
            config["transactional_id"] = transactional_id
            config["transaction_timeout_ms"] = sink.transaction_timeout_ms

        async def start(p: Any) -> None:
            await p.start()

        async def stop(p: Any) -> None:
            await p.stop()

        try:
            return await start_with_deadline(
                lambda: AIOKafkaProducer(bootstrap_servers=sink.bootstrap_servers, **config),
                start,
                stop,
                bootstrap_servers=sink.bootstrap_servers,
                timeout_s=sink.connect_timeout_s,
                what=f"producer {transactional_id or '(idempotent)'} start",
            )
        except ConnectorError as exc:
            if "InvalidTransactionTimeout" in str(exc):
                raise ConnectorError(
                    f"{exc} (transaction_timeout_ms={sink.transaction_timeout_ms} exceeds "
                    "the broker's transaction.max.timeout.ms)",
                    retriable=False,
                ) from exc
            raise

    def _fail(self, exc: ConnectorError) -> ConnectorError:
        if self._failure is None:
            self._failure = exc
        return exc

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if not self._recovered:
            raise ConnectorError(f"{self._label}: writer used before recover()")
        if self._closed:
            raise ConnectorError(f"{self._label}: writer used after close()")

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await _quietly(client.close(), "closing the metadata client")


async def _quietly(aw: Any, what: str, timeout_s: float = 10.0) -> None:
    try:
        await asyncio.wait_for(aw, timeout_s)
    except Exception as exc:  # closing after a failure must not hide the failure
        log.warning("Kafka sink: error while %s: %r", what, exc)


class TransactionalKafkaWriter(_WriterBase):
    """Exactly-once writer of one subtask; see the module docstring."""

    def __init__(self, sink: KafkaSink, ctx: ConnectorContext) -> None:
        super().__init__(sink, ctx)
        self._base = sink.transactional_id_prefix or f"{ctx.job_name}-{ctx.operator_uid}"
        self._prefix = f"{self._base}-{ctx.subtask_index}"
        self._slots = [_Slot(i, f"{self._prefix}-{i}") for i in range(sink.pool_size)]
        self._open: _Slot | None = None
        self._pending: list[_Slot] = []
        self._next_slot = 0
        self._changed: asyncio.Event | None = None
        self._bg: set[asyncio.Task[None]] = set()

    @property
    def transactional_ids(self) -> list[str]:
        return [s.transactional_id for s in self._slots]

    # -- recovery -------------------------------------------------------------

    async def recover(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> None:
        """Commit what the restored checkpoint lists, then fence and abort every slot."""
        self._changed = asyncio.Event()
        await self._connect()
        state = restored or {}
        for entry in state.get("pending", []):
            await self._commit_on_recovery(int(entry[0]), PreparedTransaction(*entry[1:]))
        # Only now may InitProducerId run for these ids (see the module docstring).
        stale = [
            f"{self._prefix}-{i}" for i in range(len(self._slots), int(state.get("pool_size", 0)))
        ]
        started = await asyncio.gather(
            *(self._start_producer(s.transactional_id) for s in self._slots),
            *(self._start_producer(t) for t in stale),
            return_exceptions=True,
        )
        errors = [r for r in started if isinstance(r, BaseException)]
        for slot, producer in zip(self._slots, started, strict=False):
            if not isinstance(producer, BaseException):
                slot.producer = producer
                slot.advance(TxnState.IDLE)
        for producer in started[len(self._slots) :]:
            if not isinstance(producer, BaseException):
                await _quietly(producer.stop(), "closing a fenced stale slot")
        if errors:
            raise errors[0]
        self._recovered = True
        log.info(
            "%s: recovered from checkpoint %s; %d transactional producers %s-0..%d ready",
            self._label,
            checkpoint_id,
            len(self._slots),
            self._prefix,
            len(self._slots) - 1,
        )

    def _stale_ids(self, state: dict[str, Any]) -> list[str]:
        """Old transactional ids outside the pool that only this instance may fence.

        Slots beyond a pool that shrank; after a rescale (merged state with
        ``pools``), subtask 0 also takes the slots of old subtasks at or above
        the new parallelism. Every instance commits every listed transaction
        before it fences anything, so fencing never aborts a listed one.
        """
        sub = self._ctx.subtask_index
        pools = {int(k): int(v) for k, v in state.get("pools", {}).items()}
        own_before = int(state.get("pool_size", pools.get(sub, 0)))
        ids = [f"{self._prefix}-{i}" for i in range(len(self._slots), own_before)]
        if sub == 0:
            for old, size in sorted(pools.items()):
                if old >= self._ctx.parallelism:
                    ids += [f"{self._base}-{old}-{i}" for i in range(size)]
        return ids

    @staticmethod
    def merge_states(states: Sequence[Mapping[str, Any] | None]) -> dict[str, Any]:
        """Merge old instances' states for a restore at another parallelism.

        Committing a listed transaction is idempotent (EndTxn on a committed
        transaction succeeds), so every new instance may get every one.
        """
        pending: dict[str, list[Any]] = {}
        for state in states:
            for entry in (state or {}).get("pending", []):
                pending.setdefault(f"{entry[1]}/{entry[2]}/{entry[3]}", list(entry))
        return {
            "pending": sorted(pending.values(), key=lambda e: int(e[0])),
            "pools": {str(i): int(s.get("pool_size", 0)) for i, s in enumerate(states) if s},
        }

    async def _commit_on_recovery(self, checkpoint_id: int, txn: PreparedTransaction) -> None:
        outcome = await end_prepared_transaction(
            self._client, txn, commit=True, timeout_s=self._sink.commit_timeout_s
        )
        if outcome is EndTxnOutcome.COMPLETED:
            log.info(
                "%s: committed transaction %s (epoch %d) of checkpoint %d on recovery",
                self._label,
                txn.transactional_id,
                txn.producer_epoch,
                checkpoint_id,
            )
        elif outcome is EndTxnOutcome.FENCED:
            # A slot is reused only after its commit, so this is almost always
            # "committed before the crash"; a transaction timeout would also
            # answer FENCED (then its records are lost: raise the timeout).
            log.warning(
                "%s: transaction %s of checkpoint %d already ended (fenced: committed "
                "before the restart, or aborted by the transaction timeout)",
                self._label,
                txn.transactional_id,
                checkpoint_id,
            )
        else:
            log.error(
                "%s: transaction %s of checkpoint %d cannot be committed (%s); its records "
                "are not in the output",
                self._label,
                txn.transactional_id,
                checkpoint_id,
                outcome.value,
            )

    # -- writing --------------------------------------------------------------

    async def write(self, batch: list[Any]) -> None:
        if not batch:
            return
        self._check_usable()
        slot = self._open or await self._begin()
        assert self._encoder is not None
        self.records_written += await self._encoder.send(slot.producer, batch)

    async def _begin(self) -> _Slot:
        slot = await self._acquire()
        try:
            await slot.producer.begin_transaction()
        except kafka_errors.KafkaError as exc:
            raise self._fail(connector_error(f"{slot.transactional_id}: begin", exc)) from exc
        slot.advance(TxnState.OPEN)
        self._open = slot
        return slot

    async def _acquire(self) -> _Slot:
        """Take an idle slot, round-robin; wait for a commit or restart if none is."""
        assert self._changed is not None
        deadline = time.monotonic() + self._sink.slot_wait_timeout_s
        warned = False
        n = len(self._slots)
        while True:
            if self._failure is not None:
                raise self._failure
            for i in range(n):
                slot = self._slots[(self._next_slot + i) % n]
                if slot.state is TxnState.IDLE:
                    self._next_slot = slot.index + 1
                    return slot
            if not warned and all(s.state is TxnState.PRECOMMITTED for s in self._slots):
                log.warning(
                    "%s: all %d transactional producers hold pre-committed transactions; "
                    "waiting for a checkpoint to complete",
                    self._label,
                    n,
                )
                warned = True
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), deadline - time.monotonic())
            except TimeoutError:
                raise self._fail(
                    ConnectorError(
                        f"{self._label}: no transactional producer free within "
                        f"{self._sink.slot_wait_timeout_s:g}s (checkpoints not completing)",
                        retriable=True,
                    )
                ) from None

    # -- two-phase commit -----------------------------------------------------

    async def prepare_commit(self, checkpoint_id: int) -> dict[str, Any]:
        """Flush the open transaction and list it (with all still pending) in the state."""
        self._check_usable()
        if self._pending and self._pending[-1].checkpoint_id >= checkpoint_id:
            raise ConnectorError(
                f"{self._label}: prepare_commit({checkpoint_id}) after "
                f"prepare_commit({self._pending[-1].checkpoint_id})"
            )
        slot, self._open = self._open, None
        if slot is not None:
            assert self._encoder is not None
            try:
                await asyncio.wait_for(slot.producer.flush(), self._sink.commit_timeout_s)
                self._encoder.check_delivered()
            except (kafka_errors.KafkaError, TimeoutError) as exc:
                raise self._fail(connector_error(f"{slot.transactional_id}: flush", exc)) from exc
            except ConnectorError as exc:
                raise self._fail(exc) from exc
            slot.prepared = prepared_transaction(slot.producer)
            slot.checkpoint_id = checkpoint_id
            slot.advance(TxnState.PRECOMMITTED)
            self._pending.append(slot)
        return self.state()

    def state(self) -> dict[str, Any]:
        """Writer state: ``[checkpoint, transactional id, producer id, epoch]`` per pending txn."""
        return {
            "pending": [[s.checkpoint_id, *s.prepared] for s in self._pending if s.prepared],
            "pool_size": len(self._slots),
        }

    async def commit(self, checkpoint_id: int) -> None:
        """Commit every pre-committed transaction up to ``checkpoint_id``; idempotent."""
        if self._failure is not None:
            raise self._failure
        for slot in [s for s in self._pending if s.checkpoint_id <= checkpoint_id]:
            await self._commit_slot(slot)
            slot.advance(TxnState.COMMITTED)
            self._pending.remove(slot)
            self._spawn_recycle(slot)

    async def _commit_slot(self, slot: _Slot) -> None:
        assert slot.prepared is not None
        try:
            await asyncio.wait_for(slot.producer.commit_transaction(), self._sink.commit_timeout_s)
            return
        except kafka_errors.ProducerFenced as exc:
            raise self._fail(self._fenced(slot)) from exc
        except Exception as exc:  # the producer is unusable; the stored id and epoch aren't
            log.warning(
                "%s: commit of %s through its producer failed (%r); resuming it by EndTxn",
                self._label,
                slot.transactional_id,
                exc,
            )
        try:
            outcome = await end_prepared_transaction(
                self._client, slot.prepared, commit=True, timeout_s=self._sink.commit_timeout_s
            )
        except ConnectorError as exc:
            raise self._fail(exc) from exc
        if outcome is EndTxnOutcome.FENCED:
            raise self._fail(self._fenced(slot))
        if outcome is not EndTxnOutcome.COMPLETED:
            raise self._fail(
                ConnectorError(
                    f"{self._label}: transaction {slot.transactional_id} of checkpoint "
                    f"{slot.checkpoint_id} cannot be committed: {outcome.value}",
                    retriable=False,
                )
            )

    def _fenced(self, slot: _Slot) -> ConnectorError:
        return ConnectorError(
            f"{self._label}: producer {slot.transactional_id} was fenced: another instance "
            "of this sink took over (zombie writer)",
            retriable=False,
        )

    def _spawn_recycle(self, slot: _Slot) -> None:
        task = asyncio.create_task(self._recycle(slot), name=f"recycle-{slot.transactional_id}")
        self._bg.add(task)
        task.add_done_callback(self._bg_done)

    def _bg_done(self, task: asyncio.Task[None]) -> None:
        self._bg.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self._fail(
                exc
                if isinstance(exc, ConnectorError)
                else ConnectorError(f"{self._label}: {exc!r}", retriable=True)
            )
            if self._changed is not None:
                self._changed.set()

    async def _recycle(self, slot: _Slot) -> None:
        """Replace a slot's producer after its transaction ended: a new epoch per transaction."""
        old, slot.producer = slot.producer, None
        slot.advance(TxnState.STARTING)
        await _quietly(old.stop(), f"stopping {slot.transactional_id}")
        slot.producer = await self._start_producer(slot.transactional_id)
        slot.advance(TxnState.IDLE)
        assert self._changed is not None
        self._changed.set()

    async def close(self) -> None:
        """Abort the open transaction (no checkpoint covers it); keep pre-committed ones.

        A pre-committed transaction's checkpoint may have completed: the next
        recovery commits or fences it, so closing must not abort it.
        """
        if self._closed:
            return
        self._closed = True
        for task in list(self._bg):
            task.cancel()
        await asyncio.gather(*self._bg, return_exceptions=True)
        slot, self._open = self._open, None
        if slot is not None and slot.producer is not None:
            await _quietly(slot.producer.abort_transaction(), f"aborting {slot.transactional_id}")
            slot.advance(TxnState.ABORTED)
            if self._encoder is not None:
                self._encoder.reset()
        producers = [s.producer for s in self._slots if s.producer is not None]
        await asyncio.gather(*(_quietly(p.stop(), "stopping a producer") for p in producers))
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
        self._producer = await self._start_producer(None)
        self._recovered = True

    async def write(self, batch: list[Any]) -> None:
        if not batch:
            return
        self._check_usable()
        assert self._encoder is not None
        self.records_written += await self._encoder.send(self._producer, batch)

    async def prepare_commit(self, checkpoint_id: int) -> dict[str, Any]:
        self._check_usable()
        assert self._encoder is not None
        try:
            await asyncio.wait_for(self._producer.flush(), self._sink.commit_timeout_s)
            self._encoder.check_delivered()
        except (kafka_errors.KafkaError, TimeoutError) as exc:
            raise self._fail(connector_error(f"{self._label}: flush", exc)) from exc
        except ConnectorError as exc:
            raise self._fail(exc) from exc
        return {}

    async def commit(self, checkpoint_id: int) -> None:
        return None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        producer, self._producer = self._producer, None
        if producer is not None:
            await _quietly(producer.stop(), "stopping the producer")
        await self._close_client()
