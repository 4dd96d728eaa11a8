"""How a task's output is spread over the next stage's instances."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier
from aiostream_ckpt.errors import PartitioningError
from aiostream_ckpt.keygroups import WHOLE_JOB, Shard
from aiostream_ckpt.runtime.channels import ChannelSender
from aiostream_ckpt.runtime.record_errors import dead_letter_or_raise
from aiostream_ckpt.state.keygroups import (
    key_group_for,
    operator_index_for_key_group,
    serialize_key,
)
from aiostream_ckpt.user_errors import function_name, short_repr

_ROUTE_CACHE_LIMIT = 1 << 20


class OutputGate(ABC):
    """Sends batches to downstream channels according to a partitioning scheme.

    Control elements always go to every channel (barriers must reach every
    input of every downstream instance for alignment to complete); an
    unaligned barrier goes ahead of what each channel has queued.
    """

    __slots__ = ("writers",)

    def __init__(self, writers: Sequence[ChannelSender]) -> None:
        self.writers = list(writers)

    @abstractmethod
    async def emit(self, batch: list[Any]) -> None:
        """Send one batch of records downstream."""

    async def broadcast_control(self, element: Any) -> None:
        if type(element) is CheckpointBarrier:
            if element.unaligned:
                for w in self.writers:
                    w.send_priority(element)
            else:
                for w in self.writers:
                    await w.send_barrier(element)
            return
        for w in self.writers:
            await w.send(element)


class ForwardGate(OutputGate):
    """One-to-one: instance i feeds instance i (same parallelism)."""

    __slots__ = ("_send",)

    def __init__(self, writers: Sequence[ChannelSender]) -> None:
        super().__init__(writers)
        assert len(writers) == 1, "forward partitioning connects exactly one channel"
        self._send = writers[0].send

    async def emit(self, batch: list[Any]) -> None:
        await self._send(batch)


class RebalanceGate(OutputGate):
    """Whole batches round-robin over downstream instances."""

    __slots__ = ("_next",)

    def __init__(self, writers: Sequence[ChannelSender]) -> None:
        super().__init__(writers)
        self._next = 0

    async def emit(self, batch: list[Any]) -> None:
        writer = self.writers[self._next]
        self._next = (self._next + 1) % len(self.writers)
        await writer.send(batch)


class BroadcastGate(OutputGate):
    """Every record to every downstream instance."""

    async def emit(self, batch: list[Any]) -> None:
        for w in self.writers:
            await w.send(batch)


def outside_shard(target_uid: str, key: Any, key_group: int, shard: Shard, maxp: int) -> str:
    """Say why a keyed record cannot go on here: its key's state lives in another shard."""
    other = Shard(shard.of_key_group(key_group, maxp), shard.count)
    own = shard.key_groups(maxp)
    return (
        f"operator {target_uid!r}: key {short_repr(key)} is in key group {key_group}, which "
        f"shard {other} owns, but this daemon runs shard {shard} (key groups "
        f"{own.start}-{own.end} of {maxp}); shards share no state, so a keyed operator "
        "may only see the keys its shard's input partitions hold. To key by another key "
        "than the input is partitioned by, send the stream through a Kafka topic "
        "partitioned by that key (Stream.through(...), see docs/shards.md) and key the next "
        "stage by it; the record did not reach state"
    )


class KeyGroupGate(OutputGate):
    """Hash partitioning by key group, so state can be redistributed later.

    The route of a key is cached: serializing and hashing it once per key, not
    once per record, keeps this off the hot path.

    ``first`` and ``parallelism`` place the downstream instances in the job
    (in a sharded job, writer i feeds the job's subtask ``first + i`` of
    ``parallelism``); a key whose owner is not among them belongs to another
    shard, and the job fails naming it (:func:`outside_shard`), before the
    record reaches any state.

    The key selector is user code run per record here, in the upstream task:
    a record it fails on is dead-lettered by that task's ``process_errors``
    (``errors.on_process_error=dead_letter``, set by the task) in the name of
    ``target_uid``, the keyed operator, and the batch goes on; else the job
    fails naming the selector, the operator and the record.
    """

    __slots__ = (
        "_first",
        "_key_selector",
        "_max_parallelism",
        "_parallelism",
        "_routes",
        "_shard",
        "process_errors",
        "target_uid",
    )

    def __init__(
        self,
        writers: Sequence[ChannelSender],
        key_selector: Callable[[Any], Any],
        max_parallelism: int,
        target_uid: str = "",
        *,
        first: int = 0,
        parallelism: int | None = None,
        shard: Shard = WHOLE_JOB,
    ) -> None:
        super().__init__(writers)
        self._key_selector = key_selector
        self._max_parallelism = max_parallelism
        self._first = first
        self._parallelism = len(self.writers) if parallelism is None else parallelism
        self._shard = shard
        self._routes: dict[Any, int] = {}
        self.target_uid = target_uid
        self.process_errors: Any = None

    def route(self, key: Any) -> int:
        maxp = self._max_parallelism
        kg = key_group_for(serialize_key(key), maxp)
        idx = operator_index_for_key_group(kg, self._parallelism, maxp) - self._first
        if not 0 <= idx < len(self.writers):
            raise PartitioningError(outside_shard(self.target_uid, key, kg, self._shard, maxp))
        if len(self._routes) >= _ROUTE_CACHE_LIMIT:
            self._routes.clear()
        self._routes[key] = idx
        return idx

    async def emit(self, batch: list[Any]) -> None:
        n = len(self.writers)
        if n == self._parallelism == 1:
            await self.writers[0].send(batch)
            return
        parts: list[list[Any]] = [[] for _ in range(n)]
        routes = self._routes
        ks = self._key_selector
        route = self.route
        it = iter(batch)
        while True:
            try:
                for rec in it:
                    k = ks(rec)
                    idx = routes.get(k)
                    if idx is None:
                        idx = route(k)
                    parts[idx].append(rec)
                break
            except PartitioningError:
                raise  # a key of another shard: no dead letter, the job is wrong
            except Exception as exc:
                self._key_failed(rec, exc)  # dead-lettered: go on after it
        for w, part in zip(self.writers, parts, strict=True):
            if part:
                await w.send(part)

    def _key_failed(self, record: Any, exc: Exception) -> None:
        function = f"key selector {function_name(self._key_selector)}"
        dead_letter_or_raise(
            self.process_errors,
            function,
            self.target_uid,
            "record",
            record,
            exc,
            self._key_selector,
        )
