"""A chain of map -> filter -> flat_map after the source: each operator's records, per worker.

Generated events (``app.generate``, ``app.splits``); ``map`` keeps ``seq``,
``filter`` keeps every third, ``flat_map`` emits each kept one twice, into
the exactly-once file sink at ``app.output``. N events: the filter lets
ceil(N / 3) through, the sink gets twice that.
"""

from __future__ import annotations

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink
from apps.pv_count import event_source


def build(env: StreamEnvironment) -> None:
    p = env.params
    events = env.from_source(event_source(p), uid="events")
    seqs = events.map(lambda e: e["seq"], uid="seq")
    thirds = seqs.filter(lambda s: s % 3 == 0, uid="thirds")
    twice = thirds.flat_map(lambda s: (s, s), uid="twice")
    twice.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="out")
