"""pv_count that, at random, emits an update twice, yet declares itself deterministic.

The proof's determinism check must catch it: a reference run compared with
the run under proof would show the repeats as duplicates and blame the engine.
``app.input``, ``app.output``.
"""

from __future__ import annotations

import random
from typing import Any

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.api.contract import ProofContract
from aiostream_ckpt.api.functions import Collector, Context
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from apps.pv_count import CountPageViews, app_id

#: A false declaration: the repeats depend on OS entropy, not on the input.
PROOF = ProofContract(outputs=("output",), key="app_id")

_rng = random.Random()


class CountWithRandomRepeats(CountPageViews):
    def process_element(
        self, value: dict[str, Any], ctx: Context, out: Collector[dict[str, Any]]
    ) -> None:
        super().process_element(value, ctx, out)
        if _rng.random() < 0.01:
            out.collect({"app_id": ctx.current_key, "pv": self.pv.value()})


def build(env: StreamEnvironment) -> None:
    p = env.params
    events = env.from_source(
        JsonLinesFileSource(str(p["input"]).split(","), required={"app_id": str}), uid="events"
    )
    counts = events.key_by(app_id).process(CountWithRandomRepeats(), uid="pv-count")
    counts.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="pv-sink")
