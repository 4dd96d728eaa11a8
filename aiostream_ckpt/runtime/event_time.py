"""One task's event time: watermarks in, timers fired, watermarks out.

A source task takes its watermark from its source's splits
(``time.SourceWatermarks``); an input task takes the minimum over its live
channels (``time.WatermarkValve``). When it moves, the chain's event-time
timers fire (what they emit goes through the rest of the chain first), then
the watermark goes downstream; idleness goes downstream as it changes.
Processing-time timers fire on ticks the task handles between elements, like
barriers. The task's watermark and idleness go into every checkpoint and come
back on restore (``time.checkpointed``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.clock import Clock
from aiostream_ckpt.jobspec.watermarks import MAX_WATERMARK, MIN_WATERMARK
from aiostream_ckpt.runtime.chain import ChainSpec
from aiostream_ckpt.runtime.elements import ACTIVE, IDLE, Watermark
from aiostream_ckpt.runtime.operators import RecordFailed, StreamOperator
from aiostream_ckpt.time.checkpointed import restored_time, restored_watermark
from aiostream_ckpt.time.timers import ProcessingTimeScheduler, now_millis
from aiostream_ckpt.time.valve import WatermarkValve
from aiostream_ckpt.time.watermarks import WatermarkUpdate


def fire_chain(
    operators: Sequence[Any],
    fire: Callable[[Any], list[Any]],
    finish: Callable[[RecordFailed], list[Any]],
) -> list[Any]:
    """Fire timers along a chain; what an operator emits goes through the ones after it.

    Records an earlier operator emits reach a later one before that one fires,
    so they are not late there. ``finish`` takes over a batch an operator
    failed on (dead letters, or the job's error: the task's policy).
    """
    out: list[Any] = []
    for op in operators:
        if out:
            try:
                out = op.process_batch(out)
                op.records_out += len(out)
            except RecordFailed as failure:
                out = finish(failure)  # counts what the operator emitted
        fired = fire(op)
        if fired:
            op.records_out += len(fired)
            out = out + fired if out else fired
    return out


class TaskEventTime:
    """The watermark a task holds, the timers it fires, what it sends on.

    ``advance`` is the task's step for a new watermark (a task may defer it,
    as the async operator's does until the records before it are out), which
    comes back to :meth:`advance`; ``emit`` sends what fired timers made;
    ``finish`` takes over timer output a later operator failed on (dead
    letters or the job's error, ``OperatorChain.operator_failed``).
    """

    def __init__(
        self,
        spec: ChainSpec,
        *,
        clock: Clock,
        advance: Callable[[int], Awaitable[None]],
        broadcast: Callable[[Any], Awaitable[None]],
        emit: Callable[[list[Any]], Awaitable[None]],
        finish: Callable[[RecordFailed], list[Any]],
    ) -> None:
        self._spec = spec
        self._clock = clock
        self._task_advance = advance
        self._broadcast = broadcast
        self._emit = emit
        self._finish = finish
        self._valve = WatermarkValve(spec.input_gate.num_channels) if spec.input_gate else None
        self._restored: dict[str, Any] | None = None
        #: the task's current watermark (milliseconds)
        self.watermark = MIN_WATERMARK

    def bind_timers(
        self,
        spawn: Callable[[Coroutine[Any, Any, None], str], object],
        wake: Callable[[], Awaitable[None]],
    ) -> None:
        """Give timer-keeping operators the clock and a way to wake the task when one is due."""
        timed = [op for op in self._spec.operators if hasattr(op, "bind_time")]
        if not timed:
            return
        scheduler = ProcessingTimeScheduler(self._clock, spawn, wake, self._spec.task_id)
        for op in timed:
            op.bind_time(scheduler)

    # -- what comes in ------------------------------------------------------------------

    async def on_watermark(self, channel: int, timestamp: int) -> None:
        """Take the min over live channels as the task's watermark (see ``time.valve``)."""
        assert self._valve is not None
        await self._apply(self._valve.on_watermark(channel, timestamp))

    async def on_status(self, channel: int, *, idle: bool) -> None:
        assert self._valve is not None
        await self._apply(self._valve.on_status(channel, idle=idle))

    async def on_channel_end(self, channel: int) -> None:
        """One input channel ended (others go on): it no longer holds the minimum back."""
        if self._valve is not None:
            await self._apply(self._valve.on_end(channel))

    async def after_source_read(self) -> None:
        """Source tasks: send the per-split watermark minimum when it moved."""
        assert self._spec.source_watermarks is not None
        await self._apply(self._spec.source_watermarks.poll())

    async def send_source_update(self, update: WatermarkUpdate) -> None:
        """Source tasks: send what a chunk's end moved (between the records of one read)."""
        await self._apply(update)

    async def _apply(self, update: WatermarkUpdate | None) -> None:
        if update is None:
            return
        if update.idle is not None:
            await self._broadcast(IDLE if update.idle else ACTIVE)
        if update.watermark is not None:
            await self._task_advance(update.watermark)

    # -- firing -------------------------------------------------------------------------

    async def advance(self, timestamp: int) -> None:
        """Fire the chain's event-time timers, emit what they made, then forward the watermark."""
        self.watermark = timestamp
        await self._fire(lambda op: op.process_watermark(timestamp))
        await self._broadcast(Watermark(timestamp))

    async def end(self) -> None:
        """Bounded input is over: all event time is done, every event-time timer fires."""
        if self.watermark < MAX_WATERMARK:
            await self._task_advance(MAX_WATERMARK)

    async def fire_processing_timers(self) -> None:
        """Fire due processing-time timers (on a tick, handled between elements)."""
        now = now_millis(self._clock)
        await self._fire(lambda op: op.process_processing_time(now))

    async def _fire(self, fire: Callable[[StreamOperator], list[Any]]) -> None:
        await self._emit(fire_chain(self._spec.operators, fire, self._finish))

    # -- checkpoint and restore ---------------------------------------------------------

    def snapshot(self) -> dict[str, Any] | None:
        """Return this task's watermark and idleness for the checkpoint (``time.checkpointed``)."""
        spec = self._spec
        if spec.source_watermarks is not None:
            snap: dict[str, Any] = spec.source_watermarks.snapshot()
        elif self._valve is not None:
            snap = {**self._valve.snapshot(), "layout": spec.input_layout}
        else:
            return None
        snap["watermark"] = self.watermark
        return snap

    def restore(self, restored: CompletedCheckpoint | None, uids: list[str | None]) -> None:
        """Resume where the checkpoint left event time; ``uids`` carry it (first found wins)."""
        spec = self._spec
        time = restored_time(restored, uids, subtask=spec.subtask, parallelism=spec.parallelism)
        if time is None:
            return
        self._restored = time
        if spec.source_watermarks is not None:
            spec.source_watermarks.restore(time)
        elif self._valve is not None:
            self._valve.restore(time, channels=time.get("layout") == spec.input_layout)
        self.watermark = restored_watermark(time)
        for op in spec.operators:
            op.restore_watermark(self.watermark)

    async def announce(self) -> None:
        """Before the first record after a restore: tell downstream the restored event time.

        Their channels from this task then hold what they held at the
        checkpoint, without waiting for this task's next advance.
        """
        time, self._restored = self._restored, None
        if time is None:
            return
        if self.watermark > MIN_WATERMARK:
            await self._broadcast(Watermark(self.watermark))
        if time.get("idle"):
            await self._broadcast(IDLE)
