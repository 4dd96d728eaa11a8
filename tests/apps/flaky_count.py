"""pv_count whose counter raises once at a given event (a marker file records that it did).

``app.fail_at``: the seq number to fail at; ``app.marker``: file created on failure;
``app.always_fail``: fail every attempt (to exhaust the restart strategy).
"""

from __future__ import annotations

from pathlib import Path

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from apps.pv_count import CountPageViews, app_id


class FlakyCount(CountPageViews):
    def __init__(self, fail_at: int, marker: str, always: bool) -> None:
        self.fail_at = fail_at
        self.marker = marker
        self.always = always

    def process_element(self, value, ctx, out):
        if value.get("seq") == self.fail_at and (self.always or not Path(self.marker).exists()):
            Path(self.marker).touch()
            raise RuntimeError(f"injected failure at seq {self.fail_at}")
        super().process_element(value, ctx, out)


def build(env: StreamEnvironment) -> None:
    p = env.params
    fn = FlakyCount(int(p["fail_at"]), str(p["marker"]), str(p.get("always_fail")) == "1")
    events = env.from_source(JsonLinesFileSource(str(p["input"])), uid="events")
    events.key_by(app_id).process(fn, uid="pv-count").sink_to(
        ExactlyOnceFileSink(str(p["output"])), uid="pv-sink"
    )
