"""``key_by(...).process(fn)`` when ``fn`` has timers (overrides ``on_timer``).

The record path is the plain :class:`KeyedProcessOperator`'s, untouched; this
subclass only adds the timer service and the two firing entry points the task
calls on a watermark and on a processing-time tick.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiostream_ckpt.jobspec.functions import (
    Context,
    KeyedProcessFunction,
    OnTimerContext,
    RuntimeContext,
    TimeDomain,
)
from aiostream_ckpt.runtime.operators import KeyedProcessOperator, StreamOperator
from aiostream_ckpt.time.timers import InternalTimerService, ProcessingTimeScheduler


def has_timers(function: object) -> bool:
    """Whether ``function`` overrides ``KeyedProcessFunction.on_timer``."""
    return getattr(type(function), "on_timer", None) is not KeyedProcessFunction.on_timer


class TimedKeyedProcessOperator(KeyedProcessOperator):
    """A keyed process operator whose function gets ``ctx.timer_service()``."""

    def __init__(
        self,
        uid: str,
        function: KeyedProcessFunction[Any, Any],
        key_selector: Callable[[Any], Any],
    ) -> None:
        super().__init__(uid, function, key_selector)
        self._function = function
        self._timers: InternalTimerService | None = None
        self._scheduler: ProcessingTimeScheduler | None = None

    def bind_time(self, scheduler: ProcessingTimeScheduler) -> None:
        self._scheduler = scheduler

    def open(self, ctx: RuntimeContext) -> None:
        assert self.backend is not None
        timers = self._timers = InternalTimerService(self.backend)
        if self._scheduler is not None:
            timers.bind(self._scheduler)
        super().open(ctx)
        side = self.side_output
        self._ctx = Context(timers, side)
        self._event_ctx = OnTimerContext(timers, TimeDomain.EVENT_TIME, side)
        self._proc_ctx = OnTimerContext(timers, TimeDomain.PROCESSING_TIME, side)
        timers.open()

    def process_watermark(self, timestamp: int) -> list[Any]:
        assert self._timers is not None
        out: list[Any] = []
        self._out.collect = out.append
        self._timers.advance_watermark(timestamp, self._on_event_timer)
        self._out.detach()
        return out

    def restore_watermark(self, timestamp: int) -> None:
        assert self._timers is not None
        self._timers.restore_watermark(timestamp)

    def process_processing_time(self, now_ms: int) -> list[Any]:
        assert self._timers is not None
        out: list[Any] = []
        self._out.collect = out.append
        self._timers.advance_processing_time(now_ms, self._on_processing_timer)
        self._out.detach()
        return out

    def _on_event_timer(self, timestamp: int, key: Any) -> None:
        ctx = self._event_ctx
        ctx.current_key = key
        try:
            self._function.on_timer(timestamp, ctx, self._out)
        except Exception as exc:
            self._timer_failed(TimeDomain.EVENT_TIME, timestamp, key, exc)

    def _on_processing_timer(self, timestamp: int, key: Any) -> None:
        ctx = self._proc_ctx
        ctx.current_key = key
        try:
            self._function.on_timer(timestamp, ctx, self._out)
        except Exception as exc:
            self._timer_failed(TimeDomain.PROCESSING_TIME, timestamp, key, exc)

    def _timer_failed(self, domain: TimeDomain, timestamp: int, key: Any, exc: Exception) -> None:
        """Dead-letter the timer (it is already removed: the others fire) or fail naming it."""
        timer = {"key": key, "timestamp": timestamp, "domain": domain.value}
        name = f"{type(self._function).__name__}.on_timer"
        self.user_function_failed(name, "timer", timer, exc)

    @property
    def timer_service(self) -> InternalTimerService | None:
        return self._timers


def make_keyed_process_operator(
    uid: str, function: KeyedProcessFunction[Any, Any], key_selector: Callable[[Any], Any]
) -> StreamOperator:
    """Build the plain operator, or the timed one when the function handles timers."""
    if has_timers(function):
        return TimedKeyedProcessOperator(uid, function, key_selector)
    return KeyedProcessOperator(uid, function, key_selector)
