"""Sessions per user: event-time session windows with a side output for late events.

Events ``{"user_id": ..., "ts": <ms>, ...}`` (the transitions app's input
works) arrive at most ``max_delay`` ms out of order. A user's events less than
``gap`` ms apart form one session; when the watermark passes a session's end
it emits ``{"user_id", "start", "end", "events"}``. Events behind the
watermark by more than ``lateness`` go to the side output ``late_output``.

Sessions merge as events arrive, so their contents are keyed state that
merges across checkpoints: a good test of recovery. Params (``[app]``):
``input`` (JSON-lines files, comma-separated), ``output`` (exactly-once file
sink directory), ``late_output`` (optional directory for late events),
``gap`` (ms, default 30000), ``max_delay`` (ms, default 60000), ``lateness``
(ms, default 0).

Kafka mode, when ``kafka_bootstrap`` is set: read events from ``input_topic``
(bounded with ``stop_at_end=1``), write sessions to ``output_topic`` and late
events to ``late_topic`` (optional), both exactly-once and keyed by
``user_id``. Which events are late depends on the order they are read in, so
the output is deterministic only for an input topic of one partition (the
proof's determinism check says so otherwise); not on how the partition is
fetched (``fetch_bytes``, the consumer's ``max_partition_fetch_bytes``: the
tests read it in tiny fetches), since event time moves at the same records
whatever the fetch sizes (``aiostream_ckpt.time.watermarks``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.api.contract import ProofContract
from aiostream_ckpt.api.functions import Collector
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from aiostream_ckpt.time import (
    CountAggregate,
    EventTimeSessionWindows,
    OutputTag,
    ProcessWindowFunction,
    WatermarkStrategy,
    WindowContext,
)

Event = dict[str, Any]
LATE = OutputTag[Event]("late-events")

#: Deterministic in event time; a user's sessions are emitted in time order.
PROOF = ProofContract(
    outputs=("output", "late_output"),
    key="user_id",
    kafka_outputs=("output_topic", "late_topic"),
    kafka_inputs=("input_topic",),
)


def event_ts(event: Event) -> int:
    return int(event["ts"])


def user_id(event: Event) -> Any:
    return event["user_id"]


class SessionResult(ProcessWindowFunction[int, Event, Any]):
    def process(
        self, key: Any, context: WindowContext, elements: Iterable[int], out: Collector[Event]
    ) -> None:
        w = context.window
        for n in elements:
            out.collect({"user_id": key, "start": w.start, "end": w.end, "events": n})


def _user_key(record: Event) -> str:
    return str(record["user_id"])


def build(env: StreamEnvironment) -> None:
    p = env.params
    kafka = "kafka_bootstrap" in p
    if kafka and ("input_topic" not in p or "output_topic" not in p):
        raise ValueError("Kafka mode: set app.input_topic and app.output_topic")
    if not kafka and ("output" not in p or "input" not in p):
        raise ValueError("set app.input (JSON-lines files) and app.output (output directory)")
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(
        int(p.get("max_delay", 60_000))
    ).with_timestamp_assigner(event_ts)
    source: Any
    if kafka:
        from aiostream_ckpt.connectors.kafka.source import KafkaSource

        source = KafkaSource(
            str(p["input_topic"]),
            str(p["kafka_bootstrap"]),
            stop_at_end=str(p.get("stop_at_end", "0")) == "1",
            required={"user_id": str, "ts": int},
            consumer_config=(
                {"max_partition_fetch_bytes": int(p["fetch_bytes"])} if "fetch_bytes" in p else None
            ),
        )
    else:
        source = JsonLinesFileSource([s for s in str(p["input"]).split(",") if s])
    events = env.from_source(source, uid="events", watermark_strategy=strategy)
    sessions = (
        events.key_by(user_id)
        .window(EventTimeSessionWindows.with_gap(int(p.get("gap", 30_000))))
        .allowed_lateness(int(p.get("lateness", 0)))
        .side_output_late_data(LATE)
        .aggregate(CountAggregate(), SessionResult(), uid="sessions")
    )
    if kafka:
        from aiostream_ckpt.connectors.kafka.sink import KafkaSink

        bootstrap = str(p["kafka_bootstrap"])
        out = KafkaSink(str(p["output_topic"]), bootstrap, key_fn=_user_key)
        sessions.sink_to(out, uid="sink")
        if "late_topic" in p:
            late_sink = KafkaSink(str(p["late_topic"]), bootstrap, key_fn=_user_key)
            sessions.get_side_output(LATE).sink_to(late_sink, uid="late-sink")
        return
    sessions.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="sink")
    if "late_output" in p:
        late = sessions.get_side_output(LATE)
        late.sink_to(ExactlyOnceFileSink(str(p["late_output"])), uid="late-sink")
