"""See and end transactions on the broker: ListTransactions, DescribeTransactions, fencing.

Why this exists: aiokafka 0.14's admin client has neither ListTransactions
(API 66, KIP-664) nor DescribeTransactions (API 65), and recovery must find
and abort every transaction an earlier run of a sink may have left open. Both
requests are flexible from v0; they are declared here with aiokafka's own
protocol types, so its client negotiates versions, frames and correlates them.

Fencing is InitProducerId for the transactional id, exactly what a new
producer sends on start: the coordinator bumps the epoch and aborts an ongoing
transaction (answering CONCURRENT_TRANSACTIONS until the abort markers are
written, which is retried until the abort is done). It costs one request,
not a producer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from aiokafka import errors as kafka_errors
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.transaction import InitProducerIdRequest
from aiokafka.protocol.types import (
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)

from aiostream_ckpt.connectors.kafka.transactions import RETRY_CODES, send_to_coordinator
from aiostream_ckpt.errors import ConnectorError

#: States in which a transaction holds back ``read_committed`` readers (the LSO).
OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")


def _flexible_v0(name: str, api_key: int, request: Schema, response: Schema) -> Any:
    """Declare version 0 of a flexible API (its request struct; the response rides on it)."""
    response_type = type(
        f"{name}Response_v0",
        (Response,),
        {"__module__": __name__, "API_KEY": api_key, "API_VERSION": 0, "SCHEMA": response},
    )
    return type(
        f"{name}Request_v0",
        (RequestStruct,),
        {
            "__module__": __name__,
            "FLEXIBLE_VERSION": True,
            "API_KEY": api_key,
            "API_VERSION": 0,
            "RESPONSE_TYPE": response_type,
            "SCHEMA": request,
        },
    )


_S = TypeVar("_S", bound=RequestStruct)


class _FieldsRequest(Request[_S]):  # type: ignore[misc]
    """A request built from its fields in schema order (the trailing tags left empty)."""

    API_KEY = -1  # each subclass sets its own

    def __init__(self, *fields: Any) -> None:
        self._fields = fields

    def build(self, request_struct_class: type[_S]) -> _S:
        return cast(_S, request_struct_class(*self._fields, {}))


_STRINGS = CompactArray(CompactString("utf-8"))

ListTransactionsRequest_v0 = _flexible_v0(
    "ListTransactions",
    66,
    Schema(
        ("state_filters", _STRINGS),
        ("producer_id_filters", CompactArray(Int64)),
        ("tags", TaggedFields),
    ),
    Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("unknown_state_filters", _STRINGS),
        (
            "transaction_states",
            CompactArray(
                ("transactional_id", CompactString("utf-8")),
                ("producer_id", Int64),
                ("transaction_state", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    ),
)


class ListTransactionsRequest(_FieldsRequest[ListTransactionsRequest_v0]):  # type: ignore[valid-type]
    API_KEY = 66

    def __init__(self, states: list[str]) -> None:
        super().__init__(states, [])


DescribeTransactionsRequest_v0 = _flexible_v0(
    "DescribeTransactions",
    65,
    Schema(("transactional_ids", _STRINGS), ("tags", TaggedFields)),
    Schema(
        ("throttle_time_ms", Int32),
        (
            "transaction_states",
            CompactArray(
                ("error_code", Int16),
                ("transactional_id", CompactString("utf-8")),
                ("transaction_state", CompactString("utf-8")),
                ("transaction_timeout_ms", Int32),
                ("transaction_start_time_ms", Int64),
                ("producer_id", Int64),
                ("producer_epoch", Int16),
                (
                    "topics",
                    CompactArray(
                        ("topic", CompactString("utf-8")),
                        ("partitions", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    ),
)


class DescribeTransactionsRequest(_FieldsRequest[DescribeTransactionsRequest_v0]):  # type: ignore[valid-type]
    API_KEY = 65

    def __init__(self, transactional_ids: list[str]) -> None:
        super().__init__(transactional_ids)


@dataclass(frozen=True, slots=True)
class TransactionInfo:
    """What the coordinator knows about one transactional id now."""

    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    #: Broker wall clock (ms) when the open transaction began; -1 when none is open.
    start_time_ms: int
    partitions: dict[str, list[int]] = field(default_factory=dict)

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES

    def age_s(self, now_ms: float) -> float | None:
        """Seconds the open transaction has run; ``None`` when none is open."""
        if not self.is_open or self.start_time_ms < 0:
            return None
        return max(0.0, (now_ms - self.start_time_ms) / 1000)


class ListingUnsupportedError(ConnectorError):
    """The broker predates ListTransactions: open transactions can't be found by prefix."""


async def list_transactional_ids(
    client: Any, *, prefix: str, states: tuple[str, ...] = ()
) -> list[str]:
    """Transactional ids starting with ``prefix`` on every broker, in ``states`` (all if empty)."""
    await client.force_metadata_update()
    ids: set[str] = set()
    for broker in client.cluster.brokers():
        try:
            resp = await client.send(broker.nodeId, ListTransactionsRequest(list(states)))
        except kafka_errors.IncompatibleBrokerVersion as exc:
            raise ListingUnsupportedError(
                f"broker {broker.nodeId} has no ListTransactions (Kafka 3.0+, KIP-664)"
            ) from exc
        except kafka_errors.KafkaError as exc:
            raise ConnectorError(
                f"ListTransactions on broker {broker.nodeId}: {exc!r}", retriable=True
            ) from exc
        if resp.error_code:
            error = kafka_errors.for_code(resp.error_code).__name__
            raise ConnectorError(
                f"ListTransactions on broker {broker.nodeId}: {error}",
                retriable=resp.error_code in RETRY_CODES,
            )
        ids.update(t[0] for t in resp.transaction_states if t[0].startswith(prefix))
    return sorted(ids)


async def describe_transactions(
    client: Any, transactional_ids: list[str], *, timeout_s: float = 30.0
) -> list[TransactionInfo]:
    """Ask each id's coordinator for its state; ids the broker doesn't know are left out."""
    out: list[TransactionInfo] = []
    for txn_id in transactional_ids:
        resp = await send_to_coordinator(
            client,
            txn_id,
            lambda t=txn_id: DescribeTransactionsRequest([t]),  # type: ignore[misc]
            what=f"DescribeTransactions {txn_id}",
            timeout_s=timeout_s,
        )
        for row in resp.transaction_states:
            code, tid, state, timeout_ms, start_ms, pid, epoch, topics, _ = row
            if code == _TRANSACTIONAL_ID_NOT_FOUND:
                continue
            if code:
                error = kafka_errors.for_code(code).__name__
                raise ConnectorError(f"DescribeTransactions {tid}: {error}", retriable=False)
            parts = {t[0]: sorted(t[1]) for t in topics}
            out.append(TransactionInfo(tid, state, pid, epoch, timeout_ms, start_ms, parts))
    return out


async def fence_transactional_id(
    client: Any, transactional_id: str, *, transaction_timeout_ms: int, timeout_s: float = 30.0
) -> tuple[int, int]:
    """InitProducerId for ``transactional_id``: abort its open transaction, fence its producer.

    Returns the new ``(producer id, epoch)``. Waits until the abort is
    complete, so the partitions' last stable offset has moved past it.
    """
    resp = await send_to_coordinator(
        client,
        transactional_id,
        lambda: InitProducerIdRequest(transactional_id, transaction_timeout_ms),
        what=f"fencing {transactional_id}",
        timeout_s=timeout_s,
    )
    return int(resp.producer_id), int(resp.producer_epoch)


_TRANSACTIONAL_ID_NOT_FOUND = 105
