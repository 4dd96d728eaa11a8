"""pv_count whose counter raises on "poison" events: valid JSON it cannot handle, on every replay.

The raise comes before any state change, as a real bug's ``KeyError`` would.
Same params as ``apps.pv_count`` (file mode).
"""

from __future__ import annotations

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from apps.pv_count import CountPageViews, app_id


class PoisonedCount(CountPageViews):
    def process_element(self, value, ctx, out):
        if value.get("poison"):
            raise ValueError(f"poison event {value['poison']}")
        super().process_element(value, ctx, out)


def build(env: StreamEnvironment) -> None:
    p = env.params
    paths = [s for s in str(p["input"]).split(",") if s]
    rate = float(p["rate"]) if "rate" in p else None  # events a second, per input
    source = JsonLinesFileSource(paths, required={"app_id": str}, rate=rate)
    events = env.from_source(source, uid="events")
    events.key_by(app_id).process(PoisonedCount(), uid="pv-count").sink_to(
        ExactlyOnceFileSink(str(p["output"])), uid="pv-sink"
    )
