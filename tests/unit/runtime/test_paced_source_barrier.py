"""A barrier reaches a paced source that is waiting for its next record at once.

At 10 events/s the pacer sleeps 50 ms at a time (twice per read), and the
source task took a barrier only between two reads: a checkpoint waited for
the sleep, 25 ms on average (``app.rate=10``, 250 ms checkpoints: median 52 ms,
now 9 ms). The job's clock here never moves, so a sleep that the barrier does
not end never ends: on the old code the checkpoint never completed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.connectors.generator import GeneratorSource
from aiostream_ckpt.jobspec.config import CheckpointConfig, JobConfig
from aiostream_ckpt.runtime.job import JobRun, JobRunner
from tests.helpers import wait_until
from tests.unit.runtime.test_backpressure import StallingSink


async def test_a_barrier_ends_the_paced_sources_sleep(tmp_path: Path) -> None:
    config = JobConfig(checkpoint=CheckpointConfig(directory=tmp_path / "ckpt", interval=0))
    env = StreamEnvironment("paced", config=config)
    sink = StallingSink()
    sink.gate.set()
    env.from_source(GeneratorSource(100, keys=10, rate=10.0), uid="gen").sink_to(sink, uid="sink")
    clock = ManualClock()
    started: asyncio.Future[JobRun] = asyncio.get_running_loop().create_future()
    runner = JobRunner(env.spec(), clock=clock, on_started=started.set_result)
    job = asyncio.create_task(runner.run())
    run = await started
    await wait_until(lambda: clock.sleepers > 0 and run.coordinator is not None)
    coordinator = run.coordinator
    assert coordinator is not None
    try:
        for _ in range(3):  # and again: the source sleeps in between, woken each time
            done = await asyncio.wait_for(coordinator.trigger(), 10)
            assert done.checkpoint_id > 0
            await wait_until(lambda: clock.sleepers > 0)
        assert sink.written == 0  # the clock never moved: nothing was due
    finally:
        runner.cancel()
        await asyncio.wait_for(job, 30)
