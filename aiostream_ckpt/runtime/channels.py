"""Bounded channels between tasks.

Every downstream task has one :class:`InputGate`, a bounded :class:`ChannelQueue`
of ``(channel_index, element)``; each upstream instance writes through its own
:class:`ChannelWriter` (its channel index). A full queue suspends the writer,
which is how backpressure reaches the source. One queue per task (instead of
one per channel) keeps the hot path a single ``await get()``; per-channel
identity is kept for barrier alignment.

An unaligned barrier (``checkpoint.unaligned``) skips the line: it goes into
the queue's priority lane, ahead of every record queued, without waiting for
room. What it overtook on its channel is *in line* (:meth:`InputGate.in_line`):
processed as usual, and persisted with the checkpoint as channel state.

An aligned barrier that may time out (``checkpoint.aligned_timeout``) is
*announced* as it reaches the queue (:meth:`ChannelQueue.announce`: the task
starts its timer), and keeps its place in line; once the checkpoint turned
unaligned at the task, :meth:`ChannelQueue.prioritize` moves its barriers
queued in line into the priority lane, and those that come later go there.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier


class ChannelSender(Protocol):
    """One upstream instance's end of a channel, in this process or to another one."""

    async def send(self, element: Any) -> None: ...

    def send_priority(self, element: Any) -> None:
        """Send ``element`` (an unaligned barrier) ahead of what is queued; never waits."""
        ...

    async def send_barrier(self, barrier: CheckpointBarrier) -> None:
        """Send an aligned barrier (the receiving end may move it ahead: ``aligned_timeout``)."""
        ...

    def fill_ratio(self) -> float:
        """How full the receiving end is for this sender (1.0: the next send suspends)."""
        ...


class ChannelQueue:
    """A bounded FIFO of ``(channel, element)`` with a priority lane ahead of it.

    ``asyncio.Queue``'s interface (what the tasks and tests use of it), plus
    :meth:`put_priority`: an element that is taken before anything queued and
    never waits for room (an unaligned barrier is tiny, and waiting would
    defeat it). Only the FIFO counts towards ``maxsize``.
    """

    __slots__ = (
        "_getters",
        "_items",
        "_priority",
        "_priority_waiters",
        "_putters",
        "maxsize",
        "on_announce",
        "overtaken",
        "prioritized",
    )

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._items: deque[tuple[int, Any]] = deque()
        self._priority: deque[tuple[int, Any]] = deque()
        self._getters: deque[asyncio.Future[None]] = deque()
        self._putters: deque[asyncio.Future[None]] = deque()
        self._priority_waiters: list[asyncio.Future[None]] = []
        #: channel -> how many of its elements its last priority element overtook
        #: (counted when it came: what the channel sends afterwards queues behind it)
        self.overtaken: dict[int, int] = {}
        #: called with each aligned barrier that may time out, as it reaches the queue
        self.on_announce: Callable[[CheckpointBarrier], None] | None = None
        #: barriers of checkpoints up to this one go into the priority lane (they
        #: turned unaligned at the task: :meth:`prioritize`)
        self.prioritized = 0

    def qsize(self) -> int:
        return len(self._items) + len(self._priority)

    def empty(self) -> bool:
        return not self._items and not self._priority

    def full(self) -> bool:
        return 0 < self.maxsize <= len(self._items)

    @property
    def has_priority(self) -> bool:
        """Whether a priority element waits (taken by the next ``get``)."""
        return bool(self._priority)

    @staticmethod
    def _wake(waiters: deque[asyncio.Future[None]]) -> None:
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    async def put(self, item: tuple[int, Any]) -> None:
        while self.full():
            fut = asyncio.get_running_loop().create_future()
            self._putters.append(fut)
            try:
                await fut
            except BaseException:
                fut.cancel()
                try:
                    self._putters.remove(fut)
                except ValueError:  # woken, then cancelled: pass the wakeup on
                    if not self.full():
                        self._wake(self._putters)
                raise
        self._items.append(item)
        self._wake(self._getters)

    def put_nowait(self, item: tuple[int, Any]) -> None:
        if self.full():
            raise asyncio.QueueFull
        self._items.append(item)
        self._wake(self._getters)

    def put_priority(self, item: tuple[int, Any], waiting: int = 0) -> None:
        """Queue ``item`` ahead of the FIFO (after earlier priority elements); never waits.

        ``waiting``: elements of its channel that arrived before it and wait to
        enter the FIFO; they and the FIFO's are what it overtook (:attr:`overtaken`).
        """
        channel = item[0]
        self.overtaken[channel] = waiting + sum(1 for c, _ in self._items if c == channel)
        self._priority.append(item)
        self._wake(self._getters)
        waiters, self._priority_waiters = self._priority_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def announce(self, barrier: CheckpointBarrier) -> bool:
        """Note an aligned barrier reaching the queue; True if it must take the priority lane."""
        if barrier.checkpoint_id <= self.prioritized:
            return True
        if barrier.timeoutable and self.on_announce is not None:
            self.on_announce(barrier)
        return False

    def prioritize(self, checkpoint_id: int) -> None:
        """Move ``checkpoint_id``'s barriers queued in line into the priority lane.

        Each one overtakes the elements of its channel behind it; those ahead of
        it are what it overtook (:attr:`overtaken`). Barriers of it that come later
        go into the lane at once (:meth:`announce`).
        """
        self.prioritized = max(self.prioritized, checkpoint_id)
        ahead: dict[int, int] = {}
        kept: deque[tuple[int, Any]] = deque()
        moved = []
        for channel, element in self._items:
            if type(element) is CheckpointBarrier and element.checkpoint_id == checkpoint_id:
                moved.append((channel, element.as_unaligned(), ahead.get(channel, 0)))
                continue
            ahead[channel] = ahead.get(channel, 0) + 1
            kept.append((channel, element))
        if not moved:
            return
        self._items = kept
        for channel, barrier, count in moved:
            self.put_priority((channel, barrier))
            self.overtaken[channel] = count
        while self._putters and not self.full():  # the lane does not count towards maxsize
            self._wake(self._putters)

    def priority_arrival(self) -> asyncio.Future[None]:
        """Return a future that resolves once a priority element is queued (done if one is)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._priority:
            fut.set_result(None)
        else:
            self._priority_waiters.append(fut)
        return fut

    async def get(self) -> tuple[int, Any]:
        while not self._items and not self._priority:
            fut = asyncio.get_running_loop().create_future()
            self._getters.append(fut)
            try:
                await fut
            except BaseException:
                fut.cancel()
                try:
                    self._getters.remove(fut)
                except ValueError:  # woken, then cancelled: pass the wakeup on
                    if not self.empty():
                        self._wake(self._getters)
                raise
        return self.get_nowait()

    def get_nowait(self) -> tuple[int, Any]:
        if self._priority:
            return self._priority.popleft()
        if not self._items:
            raise asyncio.QueueEmpty
        item = self._items.popleft()
        if self._putters:
            self._wake(self._putters)
        return item

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        """Iterate over the FIFO's elements in order (not the priority lane)."""
        return iter(self._items)


class InputGate:
    """The inbox of one task instance, fed by ``num_channels`` upstream instances."""

    __slots__ = ("_pending", "capacity", "num_channels", "queue")

    def __init__(self, num_channels: int, capacity: int) -> None:
        self.num_channels = num_channels
        self.capacity = capacity
        self.queue = ChannelQueue(capacity)
        #: channel index -> elements that arrived from another process and wait to
        #: enter the queue (``RemoteInput.pending``): in line after the queue's
        self._pending: dict[int, deque[tuple[int, Any]]] = {}

    def writer(self, channel_index: int) -> ChannelWriter:
        return ChannelWriter(self.queue, channel_index)

    def fill_ratio(self) -> float:
        return self.queue.qsize() / self.capacity if self.capacity else 0.0

    def attach_pending(self, channel_index: int, pending: deque[tuple[int, Any]]) -> None:
        """Count ``pending`` (a remote channel's waiting elements) as in line behind the queue."""
        self._pending[channel_index] = pending

    def in_line(
        self, channel: int, checkpoint_id: int, ahead: Iterable[tuple[int, Any]] = ()
    ) -> tuple[list[Any], CheckpointBarrier | None]:
        """Return ``channel``'s unprocessed elements before its barrier >= ``checkpoint_id``.

        In order: ``ahead`` (the task's own replay, taken before the queue), the
        queue, then what waits to enter it. After the channel's priority element
        (an unaligned barrier, just taken), the queue's and the waiting ones it
        overtook when it came; else up to the barrier if one is in line (it is
        returned too), else all of them. Older barriers are left out: they
        belong to no channel state.
        """
        out: list[Any] = [e for ch, e in ahead if ch == channel]
        limit = self.queue.overtaken.pop(channel, None)
        if limit == 0:
            return _skip_barriers(out), None
        pending = self._pending.get(channel, ())
        taken = 0
        for ch, element in (*self.queue, *pending):
            if ch != channel:
                continue
            if (
                limit is None
                and type(element) is CheckpointBarrier
                and element.checkpoint_id >= checkpoint_id
            ):
                return _skip_barriers(out), element
            out.append(element)
            taken += 1
            if taken == limit:
                break
        return _skip_barriers(out), None


def _skip_barriers(elements: list[Any]) -> list[Any]:
    """Leave older barriers out: they belong to no channel state."""
    if any(type(e) is CheckpointBarrier for e in elements):
        return [e for e in elements if type(e) is not CheckpointBarrier]
    return elements


class ChannelWriter:
    """One upstream instance's end of a channel into a downstream gate."""

    __slots__ = ("index", "put", "queue")

    def __init__(self, queue: ChannelQueue, index: int) -> None:
        self.queue = queue
        self.index = index
        self.put = queue.put

    async def send(self, element: Any) -> None:
        await self.put((self.index, element))

    def send_priority(self, element: Any) -> None:
        self.queue.put_priority((self.index, element))

    async def send_barrier(self, barrier: CheckpointBarrier) -> None:
        """Send an aligned barrier: in line, or ahead once its checkpoint turned unaligned."""
        if self.queue.announce(barrier):
            self.queue.put_priority((self.index, barrier.as_unaligned()))
        else:
            await self.put((self.index, barrier))

    def fill_ratio(self) -> float:
        q = self.queue
        return q.qsize() / q.maxsize if q.maxsize else 0.0
