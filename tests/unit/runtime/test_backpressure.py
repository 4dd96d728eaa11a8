"""Backpressure: a stalled sink pauses the source; in-flight records stay bounded."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.generator import GeneratorSource
from aiostream_ckpt.jobspec.config import CheckpointConfig, JobConfig
from aiostream_ckpt.runtime.job import JobRun, JobRunner
from tests.helpers import wait_until


class StallingSink:
    """Writes only while ``gate`` is open (a deliberately slow sink)."""

    name = "stalling"

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.written = 0

    def create_writer(self, ctx: Any) -> Any:
        sink = self

        class Writer:
            async def recover(self, restored: Any, checkpoint_id: Any) -> None:
                return None

            async def write(self, batch: list[Any]) -> None:
                await sink.gate.wait()
                sink.written += len(batch)

            async def prepare_commit(self, checkpoint_id: int) -> dict[str, Any]:
                return {}

            async def commit(self, checkpoint_id: int) -> None:
                return None

            async def close(self) -> None:
                return None

        return Writer()


async def test_slow_sink_pauses_source(tmp_path: Path) -> None:
    batch, capacity = 100, 4
    config = JobConfig(
        batch_size=batch,
        channel_capacity=capacity,
        chaining=False,
        checkpoint=CheckpointConfig(directory=tmp_path / "ckpt", interval=0),
    )
    env = StreamEnvironment("bp", config=config)
    sink = StallingSink()
    env.from_source(GeneratorSource(200_000, keys=10), uid="gen").map(
        lambda e: e["seq"], uid="seq"
    ).sink_to(sink, uid="sink")
    started: asyncio.Future[JobRun] = asyncio.get_running_loop().create_future()
    job = asyncio.create_task(JobRunner(env.spec(), on_started=started.set_result).run())
    run = await started
    source = next(t for t in run.tasks if t.task_id.startswith("gen"))

    await wait_until(lambda: source.metrics.records_in > 0)
    # Let the pipeline fill up: the source must stop reading and stay stopped.
    stable, last = 0, -1
    while stable < 200:
        await asyncio.sleep(0)
        stable = stable + 1 if source.metrics.records_in == last else 0
        last = source.metrics.records_in
    # two channels (gen -> map, map -> sink) of `capacity` batches, one batch held by
    # each of the three tasks: nothing else may be in flight
    bound = (2 * capacity + 3) * batch
    assert sink.written == 0
    assert 0 < source.metrics.records_in <= bound, source.metrics.records_in

    sink.gate.set()
    result = await asyncio.wait_for(job, 60)
    assert result.status.value == "finished"
    assert sink.written == 200_000
