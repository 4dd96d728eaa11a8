"""Per-key counts kept in list, map and reducing state by one ``KeyedAsyncFunction``.

``app.input`` (JSON-lines), ``app.output``. Each event's call reads the three
states, awaits a lookup (``app.latency`` s, default 0.001), then writes them:
appends its ``seq`` to a list, adds 1 to a map entry (one of three buckets) and
adds 1 to a sum. The output ``{"app_id", "pv", "map_n", "sum_n"}`` gives the
count each kind held after the call: the list's length as ``pv`` (exactly 1..n
per key if every write was applied once), the map's total and the sum, which
must equal it. ``app.rate``: read the input at most that many events per second.
"""

from __future__ import annotations

import asyncio
import operator
from typing import Any

from aiostream_ckpt.api import (
    KeyedAsyncFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    RuntimeContext,
    StreamEnvironment,
)
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from apps.pv_count import app_id


class CountInEachKind(KeyedAsyncFunction[Any, Any]):
    def __init__(self, latency: float) -> None:
        self.latency = latency

    async def open(self, ctx: RuntimeContext) -> None:
        self.seqs = ctx.get_state(ListStateDescriptor("seqs", int))
        self.buckets = ctx.get_state(MapStateDescriptor("buckets", int, int))
        self.total = ctx.get_state(ReducingStateDescriptor("total", int, reduce_fn=operator.add))

    async def invoke(self, value: Any) -> Any:
        bucket = value["seq"] % 3
        listed = len(self.seqs.get())
        in_bucket = self.buckets.get(bucket, 0)
        mapped = sum(self.buckets.values())
        summed = self.total.get() or 0
        await asyncio.sleep(self.latency)  # read before, written after a wait
        self.seqs.add(value["seq"])
        self.buckets.put(bucket, in_bucket + 1)
        self.total.add(1)
        return {
            "app_id": value["app_id"],
            "pv": listed + 1,
            "map_n": mapped + 1,
            "sum_n": summed + 1,
        }


def build(env: StreamEnvironment) -> None:
    p = env.params
    rate = float(p["rate"]) if "rate" in p else None
    source = JsonLinesFileSource(str(p["input"]), required={"app_id": str, "seq": int}, rate=rate)
    events = env.from_source(source, uid="events")
    counted = events.key_by(app_id).map_async(
        CountInEachKind(float(p.get("latency", 0.001))), capacity=64, uid="kinds"
    )
    counted.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="kinds-sink")
