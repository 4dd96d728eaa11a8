"""Page views per app_id over two connected streams sharing one keyed count.

``app.input_a`` and ``app.input_b`` (JSON-lines files), ``app.output``: every
event of either stream adds one to its app's count, as if the two were one
input, so the committed output per key is exactly 1..n (n over both files).
``app.rate``: read each input at most that many events per second.
"""

from __future__ import annotations

from typing import Any

from aiostream_ckpt.api import KeyedCoProcessFunction, StreamEnvironment, ValueStateDescriptor
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from apps.pv_count import app_id


class CountBoth(KeyedCoProcessFunction[Any, Any, Any]):
    def open(self, ctx: Any) -> None:
        self.pv = ctx.get_state(ValueStateDescriptor("pv", default=0))

    def process_element1(self, value: Any, ctx: Any, out: Any) -> None:
        n = self.pv.value() + 1
        self.pv.update(n)
        out.collect({"app_id": ctx.current_key, "pv": n})

    process_element2 = process_element1


def build(env: StreamEnvironment) -> None:
    p = env.params
    rate = float(p["rate"]) if "rate" in p else None
    a, b = (
        env.from_source(
            JsonLinesFileSource(str(p[f"input_{uid}"]), required={"app_id": str}, rate=rate),
            uid=uid,
        )
        for uid in "ab"
    )
    counts = a.connect(b).key_by(app_id, app_id).process(CountBoth(), uid="pv-count")
    counts.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="pv-sink")
