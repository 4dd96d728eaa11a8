"""Page views per ``app_id`` (the running example of seeds/003).

Every event ``{"app_id": ..., ...}`` adds one to its app's count and emits the
update ``{"app_id": ..., "pv": n}``. The count lives in keyed state, so after a
crash the job resumes from the checkpointed counts and source offsets and the
committed output is exactly that of a failure-free run.

Params (``[app]`` in the config or ``--set app.KEY=VALUE``):

- ``input``: JSON-lines file(s), comma-separated; or ``generate=N`` for N
  generated events (``seed``, ``keys``).
- ``output``: directory of the exactly-once file sink.
"""

from __future__ import annotations

from typing import Any

from aiostream_ckpt.api import KeyedProcessFunction, StreamEnvironment, ValueStateDescriptor
from aiostream_ckpt.api.functions import Collector, Context, RuntimeContext
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from aiostream_ckpt.connectors.generator import GeneratorSource


class CountPageViews(KeyedProcessFunction[dict[str, Any], dict[str, Any]]):
    """pv += 1 per event of the key; emits the new count."""

    def open(self, ctx: RuntimeContext) -> None:
        self.pv = ctx.get_state(ValueStateDescriptor("pv", default=0))

    def process_element(
        self, value: dict[str, Any], ctx: Context, out: Collector[dict[str, Any]]
    ) -> None:
        n = self.pv.value() + 1
        self.pv.update(n)
        out.collect({"app_id": ctx.current_key, "pv": n})


def app_id(event: dict[str, Any]) -> Any:
    return event["app_id"]


def build(env: StreamEnvironment) -> None:
    p = env.params
    if "output" not in p:
        raise ValueError("set app.output (the output directory)")
    if "generate" in p:
        source: Any = GeneratorSource(
            int(p["generate"]), seed=int(p.get("seed", 0)), keys=int(p.get("keys", 1000))
        )
    elif "input" in p:
        source = JsonLinesFileSource([s for s in str(p["input"]).split(",") if s])
    else:
        raise ValueError("set app.input (JSON-lines file) or app.generate (event count)")
    events = env.from_source(source, uid="events")
    counts = events.key_by(app_id).process(CountPageViews(), uid="pv-count", name="pv-count")
    counts.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="pv-sink")
