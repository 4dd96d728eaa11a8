"""Page views per app_id counted in keyed state by an async function (``KeyedAsyncFunction``).

``app.input`` (JSON-lines), ``app.output``: each event gets ``{"app_id", "pv": n}`` after
an awaited lookup (``app.latency`` s, default 0.001); ``n`` is the key's count, kept in
the function's value state, so the committed output per key is exactly 1..n.
``app.rate``: read the input at most that many events per second.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiostream_ckpt.api import (
    KeyedAsyncFunction,
    RuntimeContext,
    StreamEnvironment,
    ValueStateDescriptor,
)
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from apps.pv_count import app_id


class CountAfterLookup(KeyedAsyncFunction[Any, Any]):
    def __init__(self, latency: float) -> None:
        self.latency = latency

    async def open(self, ctx: RuntimeContext) -> None:
        self.pv = ctx.get_state(ValueStateDescriptor("pv", int, default=0))

    async def invoke(self, value: Any) -> Any:
        before = self.pv.value()
        await asyncio.sleep(self.latency)  # the state is read before and written after a wait
        self.pv.update(before + 1)
        return {"app_id": value["app_id"], "pv": before + 1}


def build(env: StreamEnvironment) -> None:
    p = env.params
    rate = float(p["rate"]) if "rate" in p else None
    events = env.from_source(
        JsonLinesFileSource(str(p["input"]), required={"app_id": str}, rate=rate), uid="events"
    )
    counted = events.key_by(app_id).map_async(
        CountAfterLookup(float(p.get("latency", 0.001))), capacity=64, uid="pv-count"
    )
    counted.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="pv-sink")
