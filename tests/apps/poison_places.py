"""Page-view jobs whose user code raises on "poison" events in one chosen place.

``app.poison_in`` picks where: ``key_selector`` (the ``key_by`` function, run
in the shuffle at parallelism > 1), ``timer`` (``on_timer`` of the poison
key's event-time timer), ``window`` (the window function of a window that
holds a poison event) or ``second_input`` (``process_element2`` of a
connected stream). Poison events are valid JSON ``{"app_id": "app-poison",
"poison": n, "ts": ...}`` that fail on every replay, as a real bug would.

``app.input`` (and ``app.input_b`` for ``second_input``): JSON lines with
``app_id`` and ``ts``; ``app.output``: ``{"app_id", "pv"}`` per event (1..n
per key), or ``{"app_id", "start", "n"}`` per window for ``window``.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from aiostream_ckpt.time import (
    CountAggregate,
    ProcessWindowFunction,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from apps.pv_count import CountPageViews, app_id
from tests.apps import co_count

POISON_APP = "app-poison"
WINDOW_MS = 1_000


def poison_key(event: dict[str, Any]) -> str:
    if "poison" in event:
        raise ValueError(f"poison key {event['poison']}")
    return str(event["app_id"])


class CountWithTimers(CountPageViews):
    """Counts page views; a poison event sets a timer instead, whose ``on_timer`` raises."""

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        if "poison" in value:
            ctx.timer_service().register_event_time_timer(value["ts"])
            return
        super().process_element(value, ctx, out)

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        raise ValueError(f"poison timer {timestamp}")


class Describe(ProcessWindowFunction):  # type: ignore[type-arg]
    def process(self, key: Any, context: Any, elements: Any, out: Any) -> None:
        if key == POISON_APP:
            raise ValueError(f"poison window {context.window.start}")
        for n in elements:
            out.collect({"app_id": key, "start": context.window.start, "n": n})


class CountBoth(co_count.CountBoth):
    """One count per key over both inputs; the second input's poison events raise."""

    def process_element2(self, value: Any, ctx: Any, out: Any) -> None:
        if "poison" in value:
            raise ValueError(f"poison event {value['poison']}")
        self.process_element1(value, ctx, out)


def build(env: StreamEnvironment) -> None:
    p = env.params
    where = str(p["poison_in"])
    sink = ExactlyOnceFileSink(str(p["output"]))
    paths = [s for s in str(p["input"]).split(",") if s]
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(0).with_timestamp_assigner(
        itemgetter("ts")
    )
    events = env.from_source(
        JsonLinesFileSource(paths, required={"app_id": str}),
        uid="events",
        watermark_strategy=strategy if where in ("timer", "window") else None,
    )
    if where == "key_selector":
        out = events.key_by(poison_key).process(CountPageViews(), uid="pv-count")
    elif where == "timer":
        out = events.key_by(app_id).process(CountWithTimers(), uid="pv-count")
    elif where == "window":
        out = (
            events.key_by(app_id)
            .window(TumblingEventTimeWindows.of(WINDOW_MS))
            .aggregate(CountAggregate(), Describe(), uid="pv-windows")
        )
    elif where == "second_input":
        other = JsonLinesFileSource(str(p["input_b"]), required={"app_id": str})
        b = env.from_source(other, uid="events-b")
        out = events.connect(b).key_by(app_id, app_id).process(CountBoth(), uid="pv-count")
    else:
        raise ValueError(f"app.poison_in: {where!r}")
    out.sink_to(sink, uid="pv-sink")
