"""What a source task does between two reads: barriers it was told to inject, due timers.

An input task learns of barriers and timer ticks from its input gate, between
records. A source task has no gate: the coordinator's ``trigger_checkpoint``
(this class is the :class:`~aiostream_ckpt.checkpoint.participants.TriggerTarget`
of a source task) and the processing-time scheduler queue them here, and the
source loop runs them before its next read, so a barrier always falls between
two batches (Flink's source task takes them through its mailbox the same way).
The reader's ``ConnectorContext.wakeup`` is set while any is queued, so a
reader waiting for its pace returns at once instead of after its sleep.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

from aiostream_ckpt.aio import Wakeup, unless_set
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier
from aiostream_ckpt.runtime.elements import PROCESSING_TIME_TICK, ProcessingTimeTick


class SourceTriggers:
    """Barriers and timer ticks queued for a source task, run in arrival order."""

    def __init__(
        self,
        checkpoint: Callable[[CheckpointBarrier], Awaitable[None]],
        fire_timers: Callable[[], Awaitable[None]],
        wakeup: Wakeup | None = None,
    ) -> None:
        """``wakeup``: the reader's, set while something is queued."""
        self._checkpoint = checkpoint
        self._fire_timers = fire_timers
        self._queue: deque[CheckpointBarrier | ProcessingTimeTick] = deque()
        self._arrived = asyncio.Event()
        self._wakeup = Wakeup() if wakeup is None else wakeup

    def trigger_checkpoint(self, barrier: CheckpointBarrier) -> None:
        """Inject ``barrier`` before the next batch (called by the coordinator)."""
        self._queue.append(barrier)
        self._arrived.set()
        self._wakeup.set()

    def timers_due(self) -> None:
        """Fire the due processing-time timers before the next batch."""
        self._queue.append(PROCESSING_TIME_TICK)
        self._arrived.set()
        self._wakeup.set()

    def __bool__(self) -> bool:
        return bool(self._queue)

    async def run(self) -> None:
        """Take every barrier and fire every tick queued so far, in order."""
        queue = self._queue
        while queue:
            item = queue.popleft()
            if isinstance(item, CheckpointBarrier):
                await self._checkpoint(item)
            else:
                await self._fire_timers()
        self._wakeup.clear()  # a paced reader may sleep again

    async def serve_until(self, done: asyncio.Event) -> None:
        """After the end of input: run what comes until ``done`` (the last output committed)."""
        while not done.is_set():
            if self._queue:
                await self.run()
                continue
            self._arrived.clear()
            await unless_set(self._arrived.wait(), done)
