"""Bounded channels between tasks.

Every downstream task has one :class:`InputGate`, a bounded ``asyncio.Queue`` of
``(channel_index, element)``; each upstream instance writes through its own
:class:`ChannelWriter` (its channel index). A full queue suspends the writer,
which is how backpressure reaches the source. One queue per task (instead of
one per channel) keeps the hot path a single ``await get()``; per-channel
identity is kept for barrier alignment.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class ChannelSender(Protocol):
    """One upstream instance's end of a channel, in this process or to another one."""

    async def send(self, element: Any) -> None: ...

    def fill_ratio(self) -> float:
        """How full the receiving end is for this sender (1.0: the next send suspends)."""
        ...


class InputGate:
    """The inbox of one task instance, fed by ``num_channels`` upstream instances."""

    __slots__ = ("capacity", "num_channels", "queue")

    def __init__(self, num_channels: int, capacity: int) -> None:
        self.num_channels = num_channels
        self.capacity = capacity
        self.queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue(maxsize=capacity)

    def writer(self, channel_index: int) -> ChannelWriter:
        return ChannelWriter(self.queue, channel_index)

    def fill_ratio(self) -> float:
        return self.queue.qsize() / self.capacity if self.capacity else 0.0


class ChannelWriter:
    """One upstream instance's end of a channel into a downstream gate."""

    __slots__ = ("index", "put", "queue")

    def __init__(self, queue: asyncio.Queue[tuple[int, Any]], index: int) -> None:
        self.queue = queue
        self.index = index
        self.put = queue.put

    async def send(self, element: Any) -> None:
        await self.put((self.index, element))

    def fill_ratio(self) -> float:
        q = self.queue
        return q.qsize() / q.maxsize if q.maxsize else 0.0
