"""pv_count that also sends every 10th event (by ``seq``) to a side output, sunk exactly once.

``app.input``, ``app.output`` (main), ``app.side_output`` (the sampled events);
``app.rate``: read each input at most that many events per second.
"""

from __future__ import annotations

from typing import Any

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.api.functions import Collector, Context
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from aiostream_ckpt.jobspec.functions import OutputTag
from apps.pv_count import CountPageViews, app_id

SAMPLE: OutputTag[dict[str, Any]] = OutputTag("sample")


class CountAndSample(CountPageViews):
    def process_element(
        self, value: dict[str, Any], ctx: Context, out: Collector[dict[str, Any]]
    ) -> None:
        super().process_element(value, ctx, out)
        if value["seq"] % 10 == 0:
            ctx.output(SAMPLE, {"seq": value["seq"], "app_id": ctx.current_key})


def build(env: StreamEnvironment) -> None:
    p = env.params
    rate = float(p["rate"]) if "rate" in p else None
    events = env.from_source(
        JsonLinesFileSource(str(p["input"]).split(","), required={"app_id": str}, rate=rate),
        uid="events",
    )
    counts = events.key_by(app_id).process(CountAndSample(), uid="pv-count")
    counts.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="pv-sink")
    counts.get_side_output(SAMPLE).sink_to(
        ExactlyOnceFileSink(str(p["side_output"])), uid="sample-sink"
    )
