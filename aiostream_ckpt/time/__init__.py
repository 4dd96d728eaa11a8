"""Event time: watermarks, keyed timers and windows, all inside the checkpoints.

Event time starts at a source (``env.from_source(..., watermark_strategy=...)``):
per-split watermarks flow downstream as control elements, each task's watermark
is the minimum over its live inputs, and keyed timers and windows fire on it.
Timers and window contents are keyed state, so they are in every checkpoint
and savepoint and are restored after a crash.

The names apps use are exported here; they are declared in
:mod:`aiostream_ckpt.jobspec` (``key_by(...).window(...)`` returns an
:class:`aiostream_ckpt.api.WindowedStream`). This package's modules are the
engine's side below the runtime: timers, watermark valves, source watermarks
(the window and timer operators are in :mod:`aiostream_ckpt.runtime`).
"""

from aiostream_ckpt.jobspec.functions import OnTimerContext, OutputTag, TimeDomain, TimerService
from aiostream_ckpt.jobspec.interval_join import JoinContext, ProcessJoinFunction
from aiostream_ckpt.jobspec.watermarks import MAX_WATERMARK, MIN_WATERMARK, WatermarkStrategy
from aiostream_ckpt.jobspec.window_functions import (
    AggregateFunction,
    CountAggregate,
    ProcessWindowFunction,
    WindowContext,
)
from aiostream_ckpt.jobspec.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    WindowAssigner,
)

__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "AggregateFunction",
    "CountAggregate",
    "EventTimeSessionWindows",
    "JoinContext",
    "OnTimerContext",
    "OutputTag",
    "ProcessJoinFunction",
    "ProcessWindowFunction",
    "SlidingEventTimeWindows",
    "TimeDomain",
    "TimeWindow",
    "TimerService",
    "TumblingEventTimeWindows",
    "WatermarkStrategy",
    "WindowAssigner",
    "WindowContext",
]
