"""pv_count with an ingestion timestamp, for end-to-end latency (used by the bench only).

Run as ``aiostream-ckpt run bench/apps_latency.py --set app.count=N --set app.rate=R
--set app.output=DIR``. The generator source is paced to ``rate`` events/s;
every event is stamped with the wall time it entered the job, and the output
line carries it (``{"app_id", "pv", "t"}``). The bench watches the output
directory: latency = when the committed file became visible - ``t``.
"""

from __future__ import annotations

import time
from typing import Any

from aiostream_ckpt.api import KeyedProcessFunction, StreamEnvironment, ValueStateDescriptor
from aiostream_ckpt.api.functions import Collector, Context, RuntimeContext
from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink
from aiostream_ckpt.connectors.generator import GeneratorReader, GeneratorSource


class _StampingReader:
    def __init__(self, inner: GeneratorReader) -> None:
        self._inner = inner

    async def start(self, restored: dict[str, Any] | None) -> None:
        await self._inner.start(restored)

    async def read_batch(self, max_records: int) -> list[Any] | None:
        batch = await self._inner.read_batch(max_records)
        if batch:
            now = time.time()
            batch = [{**e, "t": now} for e in batch]
        return batch

    def snapshot_position(self) -> dict[str, Any]:
        return self._inner.snapshot_position()

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        await self._inner.notify_checkpoint_complete(checkpoint_id)

    async def close(self) -> None:
        await self._inner.close()


class StampingGenerator(GeneratorSource):
    def create_reader(self, ctx: ConnectorContext) -> Any:
        return _StampingReader(super().create_reader(ctx))


class CountPageViews(KeyedProcessFunction[dict[str, Any], dict[str, Any]]):
    def open(self, ctx: RuntimeContext) -> None:
        self.pv = ctx.get_state(ValueStateDescriptor("pv", default=0))

    def process_element(
        self, value: dict[str, Any], ctx: Context, out: Collector[dict[str, Any]]
    ) -> None:
        n = self.pv.value() + 1
        self.pv.update(n)
        out.collect({"app_id": ctx.current_key, "pv": n, "t": value["t"]})


def build(env: StreamEnvironment) -> None:
    p = env.params
    source = StampingGenerator(
        int(p["count"]),
        seed=int(p.get("seed", 0)),
        keys=int(p.get("keys", 1000)),
        rate=float(p["rate"]),
    )
    events = env.from_source(source, uid="events")
    counts = events.key_by(lambda e: e["app_id"]).process(CountPageViews(), uid="pv-count")
    counts.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="pv-sink")
