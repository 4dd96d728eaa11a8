"""How a task's output is spread over the next stage's instances."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from aiostream_ckpt.runtime.channels import ChannelSender
from aiostream_ckpt.runtime.record_errors import dead_letter_or_raise
from aiostream_ckpt.state.keygroups import (
    key_group_for,
    operator_index_for_key_group,
    serialize_key,
)
from aiostream_ckpt.user_errors import function_name

_ROUTE_CACHE_LIMIT = 1 << 20


class OutputGate(ABC):
    """Sends batches to downstream channels according to a partitioning scheme.

    Control elements always go to every channel (barriers must reach every
    input of every downstream instance for alignment to complete).
    """

    __slots__ = ("writers",)

    def __init__(self, writers: Sequence[ChannelSender]) -> None:
        self.writers = list(writers)

    @abstractmethod
    async def emit(self, batch: list[Any]) -> None:
        """Send one batch of records downstream."""

    async def broadcast_control(self, element: Any) -> None:
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


class KeyGroupGate(OutputGate):
    """Hash partitioning by key group, so state can be redistributed later.

    The route of a key is cached: serializing and hashing it once per key, not
    once per record, keeps this off the hot path.

    The key selector is user code run per record here, in the upstream task:
    a record it fails on is dead-lettered by that task's ``process_errors``
    (``errors.on_process_error=dead_letter``, set by the task) in the name of
    ``target_uid``, the keyed operator, and the batch goes on; else the job
    fails naming the selector, the operator and the record.
    """

    __slots__ = ("_key_selector", "_max_parallelism", "_routes", "process_errors", "target_uid")

    def __init__(
        self,
        writers: Sequence[ChannelSender],
        key_selector: Callable[[Any], Any],
        max_parallelism: int,
        target_uid: str = "",
    ) -> None:
        super().__init__(writers)
        self._key_selector = key_selector
        self._max_parallelism = max_parallelism
        self._routes: dict[Any, int] = {}
        self.target_uid = target_uid
        self.process_errors: Any = None

    def route(self, key: Any) -> int:
        kg = key_group_for(serialize_key(key), self._max_parallelism)
        idx = operator_index_for_key_group(kg, len(self.writers), self._max_parallelism)
        if len(self._routes) >= _ROUTE_CACHE_LIMIT:
            self._routes.clear()
        self._routes[key] = idx
        return idx

    async def emit(self, batch: list[Any]) -> None:
        n = len(self.writers)
        if n == 1:
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
