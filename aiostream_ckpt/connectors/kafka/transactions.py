"""Finish a pre-committed Kafka transaction from another process, after a crash.

Why this exists: the Kafka sink's two-phase commit pre-commits at the barrier
(flush, then store ``(transactional_id, producer_id, producer_epoch)`` in the
checkpoint) and commits on notify-complete. If the process dies in between,
recovery must commit exactly the transactions whose checkpoint completed.
Flink does this with ``resumeTransaction``, which sets the stored id and epoch
on a producer by reflection and calls ``commitTransaction``. aiokafka 0.14 has
no public equivalent. Its commit path also skips EndTxn for a transaction it
didn't add partitions to itself. So we send ``EndTxn`` to the transaction
coordinator ourselves, with the stored id and epoch. We never send
``InitProducerId`` first: that would bump the epoch and abort the very
transaction we want to commit.

What a Kafka 4.1.1 broker answers (verified by
``tests/integration/kafka/test_broker_transactions.py``). aiokafka only speaks
EndTxn v0, so the coordinator takes its classic (transaction.version 1)
path even on a cluster with ``transaction.version=2``: there is no epoch bump
per transaction.

=======================================  =========================================
situation                                answer -> outcome
=======================================  =========================================
ongoing, id and epoch match              commit/abort done -> ``COMPLETED``
same, after a broker kill -9 + restart   commit done -> ``COMPLETED``
already committed, commit again          success -> ``COMPLETED`` (retry is safe)
already aborted, abort again             success -> ``COMPLETED``
aborted by us, then commit (or reverse)  INVALID_TXN_STATE (48) -> ``INVALID_STATE``
a newer producer called InitProducerId   INVALID_PRODUCER_EPOCH (47) -> ``FENCED``
(its epoch is ours + 2 if it aborted
ours, + 1 if ours had ended)
aborted by the broker on timeout         INVALID_PRODUCER_EPOCH (47) -> ``FENCED``
unknown transactional id or producer id  INVALID_PRODUCER_ID_MAPPING (49) ->
                                         ``UNKNOWN_PRODUCER_ID``
markers being written; coordinator       CONCURRENT_TRANSACTIONS (51), 14, 15, 16:
loading or moved (from the broker        retried here, with a new coordinator
source, not provoked by the tests)       lookup
=======================================  =========================================

``FENCED`` can't tell "we committed it before the epoch moved on" from "it
was aborted". InitProducerId and the timeout abort both bump the epoch, and
the old state is gone. Recovery must therefore commit *before* the new
producer calls InitProducerId (which fences zombies), and must do so before
the transaction timeout ends. The sink should use a long
``transaction_timeout_ms`` (the broker caps it at ``transaction.max.timeout.ms``).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from aiokafka import errors as kafka_errors
from aiokafka.client import AIOKafkaClient, ConnectionGroup, CoordinationType
from aiokafka.protocol.transaction import EndTxnRequest

from aiostream_ckpt.connectors.kafka.common import bootstrap_to_end, run_to_end
from aiostream_ckpt.errors import ConnectorError


class EndTxnOutcome(enum.Enum):
    """The broker's final answer to committing or aborting a prepared transaction."""

    COMPLETED = "completed"
    """The transaction now has the requested result (maybe from an earlier call)."""
    FENCED = "fenced"
    """A newer epoch owns the id; the transaction ended earlier, committed or aborted."""
    INVALID_STATE = "invalid_state"
    """The transaction ended with the other result (commit after abort, or reverse)."""
    UNKNOWN_PRODUCER_ID = "unknown_producer_id"
    """The coordinator has no producer id for this transactional id (expired or never used)."""


class PreparedTransaction(NamedTuple):
    """What the sink stores at pre-commit to finish the transaction later."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


def prepared_transaction(producer: Any) -> PreparedTransaction:
    """Read the id and epoch of a transactional ``AIOKafkaProducer``.

    Call it after ``await producer.flush()`` inside the transaction. Partitions
    are added to the transaction before their batches are sent, so after a
    flush everything sent is covered. This is private aiokafka state
    (``_txn_manager``), read here only so the rest of the code doesn't touch it.
    """
    txn = producer._txn_manager
    if txn is None or txn.transactional_id is None:
        raise ConnectorError("producer is not transactional (no transactional_id)")
    return PreparedTransaction(txn.transactional_id, txn.producer_id, txn.producer_epoch)


_OUTCOMES = {
    kafka_errors.NoError.errno: EndTxnOutcome.COMPLETED,
    kafka_errors.InvalidProducerEpoch.errno: EndTxnOutcome.FENCED,
    90: EndTxnOutcome.FENCED,  # PRODUCER_FENCED, sent as 47 below EndTxn v2
    kafka_errors.InvalidTxnState.errno: EndTxnOutcome.INVALID_STATE,
    kafka_errors.InvalidProducerIdMapping.errno: EndTxnOutcome.UNKNOWN_PRODUCER_ID,
}
#: Answers a retry (after a new coordinator lookup) may get past.
RETRY_CODES = frozenset(
    {
        kafka_errors.ConcurrentTransactions.errno,
        kafka_errors.CoordinatorLoadInProgressError.errno,
        kafka_errors.CoordinatorNotAvailableError.errno,
        kafka_errors.NotCoordinatorError.errno,
    }
)


async def end_prepared_transaction(
    client: Any,
    txn: PreparedTransaction,
    *,
    commit: bool,
    timeout_s: float = 30.0,
    retry_backoff_s: float = 0.1,
) -> EndTxnOutcome:
    """Send EndTxn for ``txn`` through a bootstrapped ``AIOKafkaClient``; retry transient errors.

    Reuse one client to recover many transactions. Raises ``ConnectorError``
    (retriable) if the coordinator can't be reached before ``timeout_s``, and
    (not retriable) on an error no retry can fix.
    """
    request = EndTxnRequest(
        transactional_id=txn.transactional_id,
        producer_id=txn.producer_id,
        producer_epoch=txn.producer_epoch,
        transaction_result=commit,
    )
    resp = await send_to_coordinator(
        client,
        txn.transactional_id,
        lambda: request,
        what=f"EndTxn for {txn}",
        timeout_s=timeout_s,
        answers=frozenset(_OUTCOMES),
        backoff_s=retry_backoff_s,
    )
    return _OUTCOMES[resp.error_code]


async def send_to_coordinator(
    client: Any,
    transactional_id: str,
    make: Callable[[], Any],
    *,
    what: str,
    timeout_s: float,
    answers: frozenset[int] = frozenset({0}),
    retry: frozenset[int] = RETRY_CODES,
    backoff_s: float = 0.1,
) -> Any:
    """Send ``make()`` to the id's transaction coordinator until it gives one of ``answers``.

    Error codes in ``retry`` (and retriable client errors) are retried with a
    new coordinator lookup until ``timeout_s`` (then a retriable
    ``ConnectorError``); any other code is a non-retriable ``ConnectorError``.
    """
    deadline = time.monotonic() + timeout_s
    last = "no attempt"
    while True:
        try:
            node = await client.coordinator_lookup(CoordinationType.TRANSACTION, transactional_id)
            resp = await client.send(node, make(), group=ConnectionGroup.COORDINATION)
        except kafka_errors.KafkaError as exc:
            if not exc.retriable:
                raise ConnectorError(f"{what}: {exc!r}", retriable=False) from exc
            last = repr(exc)
            client.force_metadata_update()
        else:
            code = getattr(resp, "error_code", 0)  # DescribeTransactions: per id
            if code in answers:
                return resp
            error = kafka_errors.for_code(code).__name__
            if code not in retry:
                raise ConnectorError(f"{what} failed: {error}", retriable=False)
            last = error
        if time.monotonic() + backoff_s > deadline:
            raise ConnectorError(f"{what} gave up after {timeout_s:.0f}s: {last}", retriable=True)
        await asyncio.sleep(backoff_s)


async def commit_prepared_transaction(
    bootstrap_servers: str,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    *,
    timeout_s: float = 30.0,
    client_kwargs: dict[str, Any] | None = None,
) -> EndTxnOutcome:
    """Commit a transaction another (possibly dead) producer pre-committed."""
    txn = PreparedTransaction(transactional_id, producer_id, producer_epoch)
    return await _with_client(bootstrap_servers, txn, True, timeout_s, client_kwargs)


async def abort_prepared_transaction(
    bootstrap_servers: str,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    *,
    timeout_s: float = 30.0,
    client_kwargs: dict[str, Any] | None = None,
) -> EndTxnOutcome:
    """Abort a pre-committed transaction whose checkpoint never completed.

    A new producer's InitProducerId would abort it too; aborting explicitly
    makes the records' fate visible now and without fencing anyone.
    """
    txn = PreparedTransaction(transactional_id, producer_id, producer_epoch)
    return await _with_client(bootstrap_servers, txn, False, timeout_s, client_kwargs)


async def _with_client(
    bootstrap_servers: str,
    txn: PreparedTransaction,
    commit: bool,
    timeout_s: float,
    client_kwargs: dict[str, Any] | None,
) -> EndTxnOutcome:
    client = bootstrap_to_end(
        AIOKafkaClient(bootstrap_servers=bootstrap_servers, **(client_kwargs or {}))
    )
    try:
        try:
            await asyncio.wait_for(client.bootstrap(), timeout_s)
        except (kafka_errors.KafkaError, TimeoutError) as exc:
            raise ConnectorError(
                f"cannot reach Kafka at {bootstrap_servers}: {exc!r}", retriable=True
            ) from exc
        return await end_prepared_transaction(client, txn, commit=commit, timeout_s=timeout_s)
    finally:
        await run_to_end(client.close(), timeout_s=None)
