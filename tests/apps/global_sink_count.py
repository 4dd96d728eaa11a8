"""pv_count with parallelism-1 ends: one source subtask, the count at ``job.parallelism``, one sink.

``app.input`` (JSON-lines files, read by the one source subtask), ``app.output``.
At ``job.workers`` > 1 the ends run in worker 0 beside its share of the count,
whose other subtasks send their updates across to the one sink. ``app.rate``: read
at most that many events per second.
"""

from __future__ import annotations

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from apps.pv_count import CountPageViews, app_id


def build(env: StreamEnvironment) -> None:
    p = env.params
    files = [s for s in str(p["input"]).split(",") if s]
    rate = float(p["rate"]) if "rate" in p else None
    source = JsonLinesFileSource(files, required={"app_id": str}, rate=rate)
    events = env.from_source(source, uid="events", parallelism=1)
    counts = events.key_by(app_id).process(CountPageViews(), uid="pv-count")
    counts.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="pv-sink", parallelism=1)
