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

Modules: :mod:`.writer` (the writers), :mod:`.pool` (the producer slots),
:mod:`.committer` (ending transactions, recovery), :mod:`.encoder` (records to
batches), :mod:`.txn_admin` (ListTransactions, DescribeTransactions, fencing).

**Recovery: approach (a), resume and commit.** If the process dies after
checkpoint n's metadata is durable but before transaction n commits, n's
records precede the checkpointed source offsets and are never replayed, so
the restarted writer must commit transaction n itself. It sends EndTxn(commit)
with the stored producer id and epoch
(:func:`~aiostream_ckpt.connectors.kafka.transactions.end_prepared_transaction`),
*before* any producer of this subtask calls InitProducerId, since that would
bump the epoch and abort the very transaction. Only then does it start a
producer on every slot: InitProducerId fences zombies and aborts whatever they
left open (transactions of checkpoints that never completed). It also fences
every other id an earlier run may have used - slots of old subtasks at or
above a smaller parallelism, slots beyond a pool that shrank, and any open
transaction the broker lists under the sink's prefix - so no transaction of
an earlier run holds ``read_committed`` readers back once the job runs. A
listed transaction that had already ended is checked against the output by
its stored offsets: if it was aborted (the job was down longer than the
transaction timeout) the job fails with :class:`~aiostream_ckpt.errors.TransactionLostError`
naming the checkpoint, the id and the lost offsets. We chose this
over (b), a write-ahead copy of each epoch's output in the checkpoint: (a)
keeps checkpoints small and output written once, and the broker behaviour it
needs is pinned by ``tests/integration/kafka/test_broker_transactions.py``.
Its conditions: the restart must come before ``transaction_timeout_ms`` (1 h
by default, Flink's advice; the broker's ``transaction.max.timeout.ms`` must
allow it), and transactional ids must not be shared with another job.

**Savepoints.** A savepoint taken while the job runs commits nothing; its
pre-committed transactions would be lost to it once a restart aborts them.
Each writer therefore keeps a copy of them inside the savepoint, read back
from the topic, and a restore of the savepoint writes the copy of an aborted
one again (:mod:`~aiostream_ckpt.connectors.kafka.savepoint_copy`).

**One producer instance per transaction.** aiokafka speaks EndTxn v0, so the
broker never bumps the epoch between transactions of one producer. If a slot
ran transaction n+2 with the epoch of n, a recovery commit of n would commit
n+2's uncheckpointed records. So a slot's producer is replaced (new
InitProducerId, new epoch) right after each commit, in the background: a
stored ``(id, epoch)`` names exactly one transaction, and a recovery EndTxn
for a transaction whose slot moved on answers FENCED ("already ended"),
never touching newer data.

**Pool sizing.** The pool has ``checkpoint.max_concurrent`` + 2 slots (the
job's setting, through :class:`~aiostream_ckpt.connectors.base.ConnectorContext`):
the open transaction, the pre-committed ones awaiting their checkpoints, and
the one whose checkpoint completed but whose commit notification hasn't run
yet when the next barrier arrives. When aborted checkpoints leave more
pre-committed transactions than that, ``write`` waits for a commit to free a
slot (backpressure, bounded by ``slot_wait_timeout_s``). This never
deadlocks: every pre-committed transaction's checkpoint was already
acknowledged by this writer.

``at_least_once``: one idempotent, non-transactional producer, flushed at the
barrier; a replay after a failure may repeat records, never lose them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import orjson

from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.kafka.addresses import check_bootstrap_servers
from aiostream_ckpt.connectors.key_grouped import KeyGroupPartitioner
from aiostream_ckpt.errors import ConfigError

if TYPE_CHECKING:
    from aiostream_ckpt.connectors.kafka.encoder import HeadersFn, KeyFn, Serializer
    from aiostream_ckpt.connectors.kafka.formats.base import RecordFormat
    from aiostream_ckpt.connectors.kafka.writer import (
        AtLeastOnceKafkaWriter,
        TransactionalKafkaWriter,
    )

__all__ = ["AtLeastOnceKafkaWriter", "KafkaSink", "TransactionalKafkaWriter"]


def __getattr__(name: str) -> Any:
    """Import the writers on first use: they need aiokafka (see :meth:`KafkaSink.create_writer`)."""
    if name in ("AtLeastOnceKafkaWriter", "TransactionalKafkaWriter"):
        from aiostream_ckpt.connectors.kafka import writer

        return getattr(writer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class KafkaSink:
    """Writes records to ``topic``; exactly-once (transactions) or at-least-once.

    ``serializer(record) -> bytes`` makes the value; ``key_fn(record)`` the key
    (records with one key go to one partition, in order; default partitioner
    murmur2, as the Java client). ``partitioner=KeyGroupPartitioner(key)``
    places records by key group instead (partition j of N holds the key
    groups subtask j of N owns), so a job reads the topic with
    ``KafkaSource(..., key_grouped=True)`` and ``reinterpret_as_keyed(key)``
    without a shuffle (:mod:`aiostream_ckpt.connectors.key_grouped`).
    ``headers_fn(record)`` a list of ``(str,
    bytes)`` headers. ``value_format`` (instead of ``serializer``) writes
    values a schema registry describes (:mod:`.formats`: Avro, Protobuf, JSON
    Schema, Confluent wire format), its schema registered or looked up under
    the topic's subject when the writer starts; ``key_format`` does the same
    for the key ``key_fn`` returns (then any value the format takes, not
    bytes). ``producer_config`` is passed to ``AIOKafkaProducer`` (TLS, SASL,
    compression). ``transactional_id_prefix`` defaults to
    ``{job name}-{operator uid}``; two jobs writing to one cluster must not
    share it. ``pool_size`` overrides the pool size derived from the job's
    settings (tests); see the module docstring for sizing and recovery.

    ``hold_batches`` (exactly-once): a partition's batch stays open across
    writes until it holds 128 KiB, is full or the barrier flushes it, since
    no record of a transaction is visible before its commit anyway; fewer,
    fuller batches take the job and the broker less CPU per record
    (:mod:`.encoder`). ``False`` sends each write's batches at its end,
    so open transactions hold records on the broker at once (``read_uncommitted``
    readers see them sooner; tests of open transactions).
    """

    def __init__(
        self,
        topic: str,
        bootstrap_servers: str,
        *,
        semantic: Literal["exactly_once", "at_least_once"] = "exactly_once",
        key_fn: KeyFn | None = None,
        partitioner: KeyGroupPartitioner | None = None,
        headers_fn: HeadersFn | None = None,
        serializer: Serializer = orjson.dumps,
        value_format: RecordFormat | None = None,
        key_format: RecordFormat | None = None,
        producer_config: dict[str, Any] | None = None,
        transactional_id_prefix: str | None = None,
        pool_size: int | None = None,
        transaction_timeout_ms: int = 3_600_000,
        connect_timeout_s: float = 30.0,
        commit_timeout_s: float = 60.0,
        slot_wait_timeout_s: float = 600.0,
        hold_batches: bool = True,
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
        if value_format is not None and serializer is not orjson.dumps:
            raise ConfigError("KafkaSink: give value_format or serializer, not both")
        if key_format is not None and key_fn is None:
            raise ConfigError("KafkaSink: key_format needs key_fn (the key it encodes)")
        self.value_format = value_format
        self.key_format = key_format
        self.topic = topic
        self.bootstrap_servers = check_bootstrap_servers(bootstrap_servers)
        self.semantic = semantic
        self.key_fn = key_fn
        self.partitioner = partitioner
        self.headers_fn = headers_fn
        self.serializer = serializer
        self.producer_config = dict(producer_config or {})
        self.transactional_id_prefix = transactional_id_prefix
        self.pool_size = pool_size
        self.transaction_timeout_ms = transaction_timeout_ms
        self.connect_timeout_s = connect_timeout_s
        self.commit_timeout_s = commit_timeout_s
        self.slot_wait_timeout_s = slot_wait_timeout_s
        self.hold_batches = hold_batches
        self.name = name

    def pool_size_for(self, ctx: ConnectorContext) -> int:
        """Slots per subtask: ``checkpoint.max_concurrent`` + 2 unless ``pool_size`` is set."""
        return self.pool_size or ctx.max_concurrent_checkpoints + 2

    def create_writer(
        self, ctx: ConnectorContext
    ) -> TransactionalKafkaWriter | AtLeastOnceKafkaWriter:
        # here, not at the top: the writers need aiokafka (~0.25 s of CPU to import), which
        # a process that only builds the job (the main one, job.workers > 1) never runs
        from aiostream_ckpt.connectors.kafka.writer import (
            AtLeastOnceKafkaWriter,
            TransactionalKafkaWriter,
        )

        if self.semantic == "exactly_once":
            return TransactionalKafkaWriter(self, ctx)
        return AtLeastOnceKafkaWriter(self, ctx)
