"""Page views per window: tumbling windows per ``app_id``, or sessions per ``user_id``.

The windowed twin of :mod:`apps.pv_count`, on the same input (its events carry
``ts`` in ms): every event counts once in one window, so the committed counts
sum to the events read, whatever failures happened.

Params (``[app]`` or ``--set app.KEY=VALUE``):

- ``input``: JSON-lines file(s), comma-separated; or ``generate=N`` generated
  events (``seed``, ``keys``, ``rate`` events per second to pace them), as pv_count.
- ``output``: directory of the exactly-once file sink.
- ``window``: ``tumbling`` (default: ``size`` ms per window, default 10000, keyed
  by ``app_id``) or ``session`` (``gap`` ms, default 30000, keyed by ``user_id``).
- ``max_delay``: ms of out-of-orderness the watermark allows (default 1000).

Output: ``{"key", "start", "end", "count"}`` per fired window.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter
from typing import Any

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.api.functions import Collector
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from aiostream_ckpt.connectors.generator import GeneratorSource
from aiostream_ckpt.time import (
    CountAggregate,
    EventTimeSessionWindows,
    ProcessWindowFunction,
    TumblingEventTimeWindows,
    WatermarkStrategy,
    WindowAssigner,
    WindowContext,
)

Event = dict[str, Any]
event_ts = itemgetter("ts")


class WindowResult(ProcessWindowFunction[int, Event, Any]):
    def process(
        self, key: Any, context: WindowContext, elements: Iterable[int], out: Collector[Event]
    ) -> None:
        w = context.window
        for n in elements:
            out.collect({"key": key, "start": w.start, "end": w.end, "count": n})


def assigner_and_key(params: dict[str, Any]) -> tuple[WindowAssigner, str]:
    """Return the window assigner and the key field that ``params`` ask for."""
    kind = str(params.get("window", "tumbling"))
    if kind == "tumbling":
        return TumblingEventTimeWindows.of(int(params.get("size", 10_000))), "app_id"
    if kind == "session":
        return EventTimeSessionWindows.with_gap(int(params.get("gap", 30_000))), "user_id"
    raise ValueError(f"app.window={kind!r}: expected 'tumbling' or 'session'")


def build(env: StreamEnvironment) -> None:
    p = env.params
    if "output" not in p:
        raise ValueError("set app.output (the output directory)")
    assigner, key_field = assigner_and_key(p)
    if "generate" in p:
        source: Any = GeneratorSource(
            int(p["generate"]),
            seed=int(p.get("seed", 0)),
            keys=int(p.get("keys", 1000)),
            rate=float(p["rate"]) if "rate" in p else None,
        )
    elif "input" in p:
        source = JsonLinesFileSource(
            [s for s in str(p["input"]).split(",") if s],
            # what the window keys and times on, no more: an event without the other
            # kind's key field is a good event here (and was dead-lettered)
            required={key_field: str, "ts": int},
        )
    else:
        raise ValueError("set app.input (JSON-lines file) or app.generate (event count)")
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(
        int(p.get("max_delay", 1_000))
    ).with_timestamp_assigner(event_ts)
    events = env.from_source(source, uid="events", watermark_strategy=strategy)
    counts = (
        events.key_by(itemgetter(key_field))
        .window(assigner)
        .aggregate(CountAggregate(), WindowResult(), uid="window-count")
    )
    counts.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="window-sink")
