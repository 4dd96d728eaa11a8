"""Page-view jobs whose user code raises on "poison" events in one chosen place.

``app.poison_in`` picks where: ``key_selector`` (the ``key_by`` function, run
in the shuffle at parallelism > 1), ``timer`` (``on_timer`` of the poison
key's event-time timer), ``window`` (the window function of a window that
holds a poison event), ``second_input`` (``process_element2`` of a
connected stream), ``timestamp_assigner`` (the source's watermark strategy),
``sink_serializer`` (the file sink's serializer, on the poison key's output)
or ``broadcast`` (``process_broadcast_element`` of the broadcast input
``app.input_b``). Poison events are valid JSON ``{"app_id": "app-poison",
"poison": n, "ts": ...}`` that fail on every replay, as a real bug would.

``app.kafka_bootstrap`` and ``app.output_topic``: write to Kafka instead
(``sink_serializer``: the Kafka sink's serializer fails).

``app.input`` (and ``app.input_b`` for ``second_input`` and ``broadcast``): JSON lines with
``app_id`` and ``ts``; ``app.output``: ``{"app_id", "pv"}`` per event (1..n
per key), or ``{"app_id", "start", "n"}`` per window for ``window``.
``app.rate``: read each input at most that many events per second.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import orjson

from aiostream_ckpt.api import (
    KeyedBroadcastProcessFunction,
    MapStateDescriptor,
    StreamEnvironment,
    ValueStateDescriptor,
)
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from aiostream_ckpt.time import (
    CountAggregate,
    ProcessWindowFunction,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from apps.pv_count import CountPageViews, _app_id_key, app_id
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


def poison_ts(event: dict[str, Any]) -> int:
    if "poison" in event:
        raise ValueError(f"poison timestamp {event['poison']}")
    return int(event["ts"])


def poison_dumps(update: dict[str, Any]) -> bytes:
    if update["app_id"] == POISON_APP:
        raise ValueError(f"poison output {update['pv']}")
    return orjson.dumps(update)


#: app_id -> broadcast events seen (every instance holds the same)
SEEN: MapStateDescriptor[str, int] = MapStateDescriptor("seen", str, int)


class CountWithBroadcast(KeyedBroadcastProcessFunction[Any, Any, Any]):
    """Counts page views; broadcast events are counted in broadcast state, poison ones raise."""

    def open(self, ctx: Any) -> None:
        self.pv = ctx.get_state(ValueStateDescriptor("pv", default=0))

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        n = self.pv.value() + 1
        self.pv.update(n)
        out.collect({"app_id": ctx.current_key, "pv": n})

    def process_broadcast_element(self, value: Any, ctx: Any, out: Any) -> None:
        if "poison" in value:
            raise ValueError(f"poison broadcast {value['poison']}")
        seen = ctx.get_broadcast_state(SEEN)
        seen.put(value["app_id"], seen.get(value["app_id"], 0) + 1)


def build(env: StreamEnvironment) -> None:
    p = env.params
    where = str(p["poison_in"])
    serializer = poison_dumps if where == "sink_serializer" else orjson.dumps
    sink: Any
    if "kafka_bootstrap" in p:  # the Kafka sink's serializer instead
        from aiostream_ckpt.connectors.kafka.sink import KafkaSink

        sink = KafkaSink(
            str(p["output_topic"]),
            str(p["kafka_bootstrap"]),
            key_fn=_app_id_key,
            serializer=serializer,
            # records before the poison reach the broker in the open transaction,
            # which the failure must abort (test_kafka_sink_poison)
            hold_batches=False,
        )
    else:
        sink = ExactlyOnceFileSink(str(p["output"]), serializer=serializer)
    paths = [s for s in str(p["input"]).split(",") if s]
    rate = float(p["rate"]) if "rate" in p else None
    ts = poison_ts if where == "timestamp_assigner" else itemgetter("ts")
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(0).with_timestamp_assigner(ts)
    events = env.from_source(
        JsonLinesFileSource(paths, required={"app_id": str}, rate=rate),
        uid="events",
        watermark_strategy=strategy if where in ("timer", "window", "timestamp_assigner") else None,
    )
    if where in ("timestamp_assigner", "sink_serializer"):
        out = events.key_by(app_id).process(CountPageViews(), uid="pv-count")
    elif where == "broadcast":
        other = JsonLinesFileSource(str(p["input_b"]), required={"app_id": str}, rate=rate)
        b = env.from_source(other, uid="events-b", parallelism=1)
        out = (
            events.key_by(app_id)
            .connect(b.broadcast(SEEN))
            .process(CountWithBroadcast(), uid="pv-count")
        )
    elif where == "key_selector":
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
        other = JsonLinesFileSource(str(p["input_b"]), required={"app_id": str}, rate=rate)
        b = env.from_source(other, uid="events-b")
        out = events.connect(b).key_by(app_id, app_id).process(CountBoth(), uid="pv-count")
    else:
        raise ValueError(f"app.poison_in: {where!r}")
    out.sink_to(sink, uid="pv-sink")
