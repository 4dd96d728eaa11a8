"""Keys of declared types: an enum key with state and timers, a date key with windows.

Events ``{"color", "day", "seq", "ts"}``. Per ``Color`` (``key_by(...,
key_type=Color)``) a process function counts events in state and sets an
event-time timer per second; per ``date`` (``key_type=date``) a tumbling window
counts events. Every output names the key's type as the engine handed it over
(``ctx.current_key`` in ``process_element`` and ``on_timer``, the window
function's key), so a key that came back from a checkpoint as ``str`` shows.
``app.rate``: read the input at most that many events per second.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from datetime import date
from typing import Any

from aiostream_ckpt.api import KeyedProcessFunction, StreamEnvironment, ValueStateDescriptor
from aiostream_ckpt.api.functions import Collector, Context, OnTimerContext, RuntimeContext
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from aiostream_ckpt.time import (
    CountAggregate,
    ProcessWindowFunction,
    TumblingEventTimeWindows,
    WatermarkStrategy,
    WindowContext,
)

Event = dict[str, Any]


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


def described(key: Any) -> str:
    return f"{type(key).__name__}:{key!r}"


class PerColor(KeyedProcessFunction[Event, Event]):
    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))

    def process_element(self, value: Event, ctx: Context, out: Collector[Event]) -> None:
        n = self.count.value() + 1
        self.count.update(n)
        ts = int(value["ts"])
        ctx.timer_service().register_event_time_timer(ts - ts % 1000 + 999)
        out.collect(
            {"kind": "event", "key": described(ctx.current_key), "seq": value["seq"], "n": n}
        )

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector[Event]) -> None:
        n = self.count.value()
        out.collect({"kind": "timer", "key": described(ctx.current_key), "at": timestamp, "n": n})


class PerDay(ProcessWindowFunction[int, Event, date]):
    def process(
        self, key: date, context: WindowContext, elements: Iterable[int], out: Collector[Event]
    ) -> None:
        w = context.window
        for n in elements:
            out.collect({"kind": "window", "key": described(key), "start": w.start, "n": n})


def build(env: StreamEnvironment) -> None:
    p = env.params
    rate = float(p["rate"]) if "rate" in p else None
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(0).with_timestamp_assigner(
        lambda e: int(e["ts"])
    )
    events = env.from_source(
        JsonLinesFileSource(str(p["input"]), rate=rate), uid="events", watermark_strategy=strategy
    )
    by_color = events.key_by(lambda e: Color(e["color"]), key_type=Color)
    by_day = events.key_by(lambda e: date.fromisoformat(e["day"]), key_type=date)
    out = by_color.process(PerColor(), uid="per-color").union(
        by_day.window(TumblingEventTimeWindows.of(2_000)).aggregate(
            CountAggregate(), PerDay(), uid="per-day"
        )
    )
    out.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="sink")
