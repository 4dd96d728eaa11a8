"""The transactional producers of one sink subtask: a pool of slots, one transaction each.

Slot ``i`` of subtask ``s`` always uses transactional id ``{base}-{s}-{i}``, so
a restarted run (or a run at another parallelism) knows every id an earlier
run may have left a transaction on. A slot holds one producer *instance* and
at most one transaction: after its commit the producer is replaced in the
background (new InitProducerId, new epoch), so a stored ``(id, epoch)`` names
exactly one transaction (see :mod:`aiostream_ckpt.connectors.kafka.sink`).

Sizing: the sink's checkpoints in flight (``checkpoint.max_concurrent``) + 2 -
the open transaction, the pre-committed ones awaiting their checkpoints, and
one whose checkpoint completed but whose commit has not run yet when the next
barrier comes. With fewer free slots :meth:`ProducerPool.acquire` waits
(backpressure, bounded by ``slot_wait_timeout_s``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaProducer

from aiostream_ckpt.connectors.kafka.common import run_to_end, start_with_deadline
from aiostream_ckpt.connectors.kafka.transactions import PreparedTransaction
from aiostream_ckpt.errors import ConnectorError

if TYPE_CHECKING:
    from aiostream_ckpt.connectors.kafka.encoder import OffsetRanges
    from aiostream_ckpt.connectors.kafka.sink import KafkaSink

log = logging.getLogger(__name__)

#: Larger than aiokafka's 16 KiB default: batches are built here, a write at a time.
MAX_BATCH_SIZE = 512 * 1024


class SlotState(enum.Enum):
    """Lifecycle of one pool slot: one producer instance, at most one transaction.

    Not a transaction state (that is :class:`~aiostream_ckpt.connectors.staging.TxnState`):
    a slot also starts its producer and idles between transactions.
    """

    STARTING = "starting"  # producer (re)starting: InitProducerId in flight
    IDLE = "idle"
    OPEN = "open"
    PRECOMMITTED = "precommitted"
    COMMITTED = "committed"
    ABORTED = "aborted"


_TRANSITIONS: dict[SlotState, frozenset[SlotState]] = {
    SlotState.STARTING: frozenset({SlotState.IDLE}),
    SlotState.IDLE: frozenset({SlotState.OPEN}),
    SlotState.OPEN: frozenset({SlotState.PRECOMMITTED, SlotState.ABORTED}),
    SlotState.PRECOMMITTED: frozenset({SlotState.COMMITTED}),
    SlotState.COMMITTED: frozenset({SlotState.STARTING}),
    SlotState.ABORTED: frozenset({SlotState.STARTING}),
}


@dataclass(slots=True)
class Slot:
    index: int
    transactional_id: str
    state: SlotState = SlotState.STARTING
    producer: Any = None
    checkpoint_id: int = -1
    prepared: PreparedTransaction | None = None
    ranges: OffsetRanges | None = None
    #: Clock reading (monotonic) when the open transaction began; ``None`` when none is.
    opened_at: float | None = None
    warned: bool = False

    def advance(self, new: SlotState) -> None:
        if new not in _TRANSITIONS[self.state]:
            raise AssertionError(f"{self.transactional_id}: {self.state.value} -> {new.value}")
        self.state = new


async def start_producer(
    sink: KafkaSink, transactional_id: str | None, producer_config: dict[str, Any]
) -> Any:
    """Start a producer (transactional if ``transactional_id``) under the connect deadline.

    ``producer_config``: the sink's, over the job's TLS/SASL settings (``merged_config``).
    """
    config: dict[str, Any] = {
        "acks": "all",
        "enable_idempotence": True,
        "max_batch_size": MAX_BATCH_SIZE,
        **producer_config,
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
            config=config,
        )
    except ConnectorError as exc:
        if "InvalidTransactionTimeout" in str(exc):
            raise ConnectorError(
                f"{exc} (transaction_timeout_ms={sink.transaction_timeout_ms} exceeds "
                "the broker's transaction.max.timeout.ms)",
                retriable=False,
            ) from exc
        raise


async def quietly(aw: Any, what: str, timeout_s: float = 10.0) -> None:
    """Await a cleanup step to its end (see ``run_to_end``); log, don't raise.

    Closing after a failure must not hide it, and a cleanup step cut short
    (stopping a producer) would leak its connections.
    """
    try:
        await run_to_end(aw, timeout_s=timeout_s)
    except Exception as exc:
        log.warning("Kafka sink: error while %s: %r", what, exc)


class ProducerPool:
    """Slots ``{prefix}-0..size-1``: start, hand out idle ones, recycle after commit, close.

    Owns the recycling tasks; a failed one is reported to ``on_failure`` and
    wakes whoever waits in :meth:`acquire`.
    """

    def __init__(
        self,
        sink: KafkaSink,
        prefix: str,
        size: int,
        *,
        label: str,
        on_failure: Callable[[BaseException], None],
        producer_config: dict[str, Any],
    ) -> None:
        self._sink = sink
        self._producer_config = producer_config
        self._label = label
        self._on_failure = on_failure
        self.slots = [Slot(i, f"{prefix}-{i}") for i in range(size)]
        self._next = 0
        self._changed = asyncio.Event()
        self._bg: set[asyncio.Task[None]] = set()

    @property
    def transactional_ids(self) -> list[str]:
        return [s.transactional_id for s in self.slots]

    async def start(self) -> None:
        """Start a producer on every slot (InitProducerId: fences and aborts their old ones)."""
        started = await asyncio.gather(
            *(
                start_producer(self._sink, s.transactional_id, self._producer_config)
                for s in self.slots
            ),
            return_exceptions=True,
        )
        for slot, producer in zip(self.slots, started, strict=True):
            if not isinstance(producer, BaseException):
                slot.producer = producer
                slot.advance(SlotState.IDLE)
        for result in started:
            if isinstance(result, BaseException):
                raise result

    async def acquire(self, failure: Callable[[], ConnectorError | None]) -> Slot:
        """Take an idle slot, round-robin; wait for a commit or restart if none is."""
        deadline = time.monotonic() + self._sink.slot_wait_timeout_s
        warned = False
        n = len(self.slots)
        while True:
            exc = failure()
            if exc is not None:
                raise exc
            for i in range(n):
                slot = self.slots[(self._next + i) % n]
                if slot.state is SlotState.IDLE:
                    self._next = slot.index + 1
                    return slot
            if not warned and all(s.state is SlotState.PRECOMMITTED for s in self.slots):
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
                raise ConnectorError(
                    f"{self._label}: no transactional producer free within "
                    f"{self._sink.slot_wait_timeout_s:g}s (checkpoints not completing)",
                    retriable=True,
                ) from None

    def recycle(self, slot: Slot) -> None:
        """Replace ``slot``'s producer in the background: a new epoch per transaction."""
        task = asyncio.create_task(self._recycle(slot), name=f"recycle-{slot.transactional_id}")
        self._bg.add(task)
        task.add_done_callback(self._bg_done)

    async def _recycle(self, slot: Slot) -> None:
        old, slot.producer = slot.producer, None
        slot.advance(SlotState.STARTING)
        slot.opened_at, slot.warned, slot.prepared, slot.ranges = None, False, None, None
        await quietly(old.stop(), f"stopping {slot.transactional_id}")
        slot.producer = await start_producer(
            self._sink, slot.transactional_id, self._producer_config
        )
        slot.advance(SlotState.IDLE)
        self._changed.set()

    def _bg_done(self, task: asyncio.Task[None]) -> None:
        self._bg.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            assert exc is not None
            self._on_failure(exc)
            self._changed.set()

    async def close(self, open_slot: Slot | None) -> None:
        """Cancel recycling, abort ``open_slot``'s transaction, stop every producer.

        Pre-committed transactions stay: their checkpoint may have completed,
        and the next recovery commits or fences them.
        """
        # A cancelled recycle still finishes stopping the old producer (``quietly``),
        # and a replacement cancelled while it starts is stopped by ``start_with_deadline``.
        for task in list(self._bg):
            task.cancel()
        await asyncio.gather(*self._bg, return_exceptions=True)
        if open_slot is not None and open_slot.producer is not None:
            await quietly(
                open_slot.producer.abort_transaction(), f"aborting {open_slot.transactional_id}"
            )
            open_slot.advance(SlotState.ABORTED)
        producers = [s.producer for s in self.slots if s.producer is not None]
        await asyncio.gather(*(quietly(p.stop(), "stopping a producer") for p in producers))
