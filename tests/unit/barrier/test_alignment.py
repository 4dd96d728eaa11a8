"""Barrier alignment: a two-input job where one input is delayed.

Exactly-once: records that arrive after barrier n on the fast input are held,
so snapshot n never contains them. At-least-once: nothing is held, processing
goes on while the slow input's barrier is still missing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aiostream_ckpt.api import KeyedProcessFunction, StreamEnvironment, ValueStateDescriptor
from aiostream_ckpt.connectors.collection import CollectSink
from aiostream_ckpt.jobspec.config import CheckpointConfig, CheckpointingMode, JobConfig
from aiostream_ckpt.runtime.job import JobRun, JobRunner
from tests.helpers import ScriptedSource, read_snapshot_value, wait_until


class Count(KeyedProcessFunction):
    def open(self, ctx):
        self.n = ctx.get_state(ValueStateDescriptor("n", default=0))

    def process_element(self, value, ctx, out):
        self.n.update(self.n.value() + 1)
        out.collect(value)


def _records(key: str, n: int) -> list[dict]:
    return [{"k": key, "i": i} for i in range(n)]


@pytest.mark.parametrize("mode", [CheckpointingMode.EXACTLY_ONCE, CheckpointingMode.AT_LEAST_ONCE])
async def test_records_after_barrier_never_enter_snapshot(tmp_path: Path, mode) -> None:
    config = JobConfig(
        checkpoint=CheckpointConfig(directory=tmp_path / "ckpt", interval=0, mode=mode)
    )
    env = StreamEnvironment("align", config=config)
    fast, slow = ScriptedSource("fast"), ScriptedSource("slow")
    a = env.from_source(fast, uid="fast")
    b = env.from_source(slow, uid="slow")
    a.union(b).key_by(lambda r: r["k"]).process(Count(), uid="count").sink_to(
        CollectSink(), uid="sink"
    )
    started: asyncio.Future[JobRun] = asyncio.get_running_loop().create_future()
    runner = JobRunner(env.spec(), on_started=started.set_result)
    job = asyncio.create_task(runner.run())
    run = await started
    counter = next(t for t in run.tasks if t.task_id.startswith("count"))
    fast_task = next(t for t in run.tasks if t.task_id.startswith("fast"))

    fast.queue.put_nowait(_records("A", 10))
    await wait_until(lambda: counter.metrics.records_in == 10)
    slow.gate.clear()  # the slow input stops: its barrier will be late
    await wait_until(lambda: slow.parked)
    assert run.coordinator is not None
    checkpoint = run.coordinator.trigger()
    handler = counter.spec.barrier_handler
    assert handler is not None
    if mode is CheckpointingMode.EXACTLY_ONCE:
        await wait_until(lambda: handler.holding)  # barrier 1 arrived on the fast input
    else:
        await wait_until(lambda: fast_task.metrics.last_checkpoint_sync_ms > 0)
    fast.queue.put_nowait(_records("A", 10))  # after barrier 1 on the fast input
    await wait_until(lambda: fast_task.metrics.records_in == 20)
    gate = counter.spec.input_gate
    assert gate is not None
    await wait_until(lambda: gate.queue.empty())

    if mode is CheckpointingMode.EXACTLY_ONCE:
        assert counter.metrics.records_in == 10, "post-barrier records must be held"
    else:
        await wait_until(lambda: counter.metrics.records_in == 20)  # not blocked

    slow.gate.set()
    completed = await checkpoint
    in_snapshot = read_snapshot_value(completed, "count", "n", "A", tmp_path / "r", default=0)
    if mode is CheckpointingMode.EXACTLY_ONCE:
        assert in_snapshot == 10
        assert completed.tasks[counter.task_id]["alignment_ms"] > 0
    else:
        assert in_snapshot == 20
    await wait_until(lambda: counter.metrics.records_in == 20)
    fast.queue.put_nowait(None)
    slow.queue.put_nowait(None)
    result = await asyncio.wait_for(job, 30)
    assert result.status.value == "finished"
