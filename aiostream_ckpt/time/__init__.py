"""Event time: watermarks, keyed timers and windows, all inside the checkpoints.

Event time starts at a source (``env.from_source(..., watermark_strategy=...)``):
per-split watermarks flow downstream as control elements, each task's watermark
is the minimum over its live inputs, and keyed timers and windows fire on it.
Timers and window contents are keyed state, so they are in every checkpoint
and savepoint and are restored after a crash.
"""

from aiostream_ckpt.api.functions import OnTimerContext, TimeDomain, TimerService
from aiostream_ckpt.runtime.elements import MAX_WATERMARK, MIN_WATERMARK
from aiostream_ckpt.runtime.side_outputs import OutputTag
from aiostream_ckpt.time.functions import (
    AggregateFunction,
    CountAggregate,
    ProcessWindowFunction,
    WindowContext,
)
from aiostream_ckpt.time.interval_join import JoinContext, ProcessJoinFunction
from aiostream_ckpt.time.watermarks import WatermarkStrategy
from aiostream_ckpt.time.windowed_stream import WindowedStream
from aiostream_ckpt.time.windows import (
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
    "WindowedStream",
]
