"""Pairs of views and buys of one user within [-20, 30] ms of each other (an interval join).

``app.left``, ``app.right`` (JSON-lines ``{"id", "k", "ts"}``, ``ts`` ascending per
file), ``app.output``: one record ``{"k", "l", "r"}`` per pair, exactly once.
``app.rate``: read each input at most that many events per second.
"""

from __future__ import annotations

from typing import Any

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from aiostream_ckpt.time import ProcessJoinFunction, WatermarkStrategy

LOWER, UPPER = -20, 30


class Pair(ProcessJoinFunction[Any, Any, Any]):
    def process_element(self, left: Any, right: Any, ctx: Any, out: Any) -> None:
        out.collect({"k": ctx.current_key, "l": left["id"], "r": right["id"]})


def build(env: StreamEnvironment) -> None:
    p = env.params
    rate = float(p["rate"]) if "rate" in p else None
    wms = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(
        lambda e: int(e["ts"])
    )
    fields = {"id": str, "k": str, "ts": int}
    left = env.from_source(
        JsonLinesFileSource(str(p["left"]), required=fields, rate=rate),
        uid="left",
        watermark_strategy=wms,
    )
    right = env.from_source(
        JsonLinesFileSource(str(p["right"]), required=fields, rate=rate),
        uid="right",
        watermark_strategy=wms,
    )
    pairs = (
        left.key_by(lambda e: e["k"])
        .interval_join(right.key_by(lambda e: e["k"]))
        .between(LOWER, UPPER)
        .process(Pair(), uid="pairs")
    )
    pairs.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="pairs-sink")
