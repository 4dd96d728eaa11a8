"""Running sum per key: the ``mapWithState`` example of seeds/001.

Input events ``{"key": "a", "value": 3}``; for each, the sum of the values seen
so far for its key is emitted as ``{"key": "a", "sum": 7}``.
"""

from __future__ import annotations

from typing import Any

from aiostream_ckpt.api import KeyedProcessFunction, StreamEnvironment, ValueStateDescriptor
from aiostream_ckpt.api.functions import Collector, Context, RuntimeContext
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource


class RunningSum(KeyedProcessFunction[dict[str, Any], dict[str, Any]]):
    def open(self, ctx: RuntimeContext) -> None:
        self.total = ctx.get_state(ValueStateDescriptor("sum", default=0))

    def process_element(
        self, value: dict[str, Any], ctx: Context, out: Collector[dict[str, Any]]
    ) -> None:
        s = self.total.value() + value["value"]
        self.total.update(s)
        out.collect({"key": ctx.current_key, "sum": s})


def build(env: StreamEnvironment) -> None:
    p = env.params
    events = env.from_source(JsonLinesFileSource(str(p["input"])), uid="events")
    sums = events.key_by(lambda e: e["key"]).process(RunningSum(), uid="running-sum")
    sums.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="sum-sink")
