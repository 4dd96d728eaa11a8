"""Process functions, as apps import them (contracts: :mod:`aiostream_ckpt.jobspec.functions`)."""

from aiostream_ckpt.jobspec.functions import (
    Collector,
    Context,
    KeyedProcessFunction,
    OnTimerContext,
    OutputTag,
    ProcessFunction,
    RuntimeContext,
    TimeDomain,
    TimerService,
)

__all__ = [
    "Collector",
    "Context",
    "KeyedProcessFunction",
    "OnTimerContext",
    "OutputTag",
    "ProcessFunction",
    "RuntimeContext",
    "TimeDomain",
    "TimerService",
]
