"""Unaligned checkpoints in a running job: the barrier overtakes, the restore replays.

Two inputs feed a ``map_async`` whose calls wait for the test: its channel
fills up and an aligned checkpoint could not complete until they return. An
unaligned one completes while they still wait, with the queued batches (and
those of the late input until its barrier came) as channel state; a job
restored from it replays them before new input, and every record is counted
exactly once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.api import KeyedProcessFunction, StreamEnvironment, ValueStateDescriptor
from aiostream_ckpt.checkpoint.history import completed_entry
from aiostream_ckpt.checkpoint.storage import CheckpointStorage, read_checkpoint
from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.connectors.collection import CollectSink
from aiostream_ckpt.daemon.inspection import inspect_checkpoint, list_checkpoints
from aiostream_ckpt.errors import JobFailedError, StateMigrationError
from aiostream_ckpt.jobspec.config import CheckpointConfig, JobConfig
from aiostream_ckpt.runtime.job import JobRun, JobRunner
from tests.helpers import ScriptedSource, wait_until

BATCH = 10


class Count(KeyedProcessFunction):
    def open(self, ctx):
        self.n = ctx.get_state(ValueStateDescriptor("n", default=0))

    def process_element(self, value, ctx, out):
        n = self.n.value() + 1
        self.n.update(n)
        out.collect({**value, "n": n})


def batches(src: str, first: int, count: int) -> list[list[dict[str, Any]]]:
    out = []
    for b in range(first, first + count):
        out.append([{"src": src, "i": b * BATCH + j, "k": j % 3} for j in range(BATCH)])
    return out


def build(
    tmp: Path,
    a: ScriptedSource,
    b: ScriptedSource,
    calls: asyncio.Event,
    parallelism: int = 1,
    aligned_timeout: float = 0.0,
) -> tuple[Any, CollectSink]:
    config = JobConfig(
        batch_size=BATCH,
        parallelism=parallelism,
        checkpoint=CheckpointConfig(
            directory=tmp / "ckpt", interval=0, unaligned=True, aligned_timeout=aligned_timeout
        ),
    )
    env = StreamEnvironment("unaligned", config=config)

    async def slow(record: dict[str, Any]) -> dict[str, Any]:
        await calls.wait()
        return record

    sink = CollectSink()
    (
        env.from_source(a, uid="a", parallelism=1)
        .union(env.from_source(b, uid="b", parallelism=1))
        .map_async(slow, capacity=5, uid="slow")
        .key_by(lambda r: r["k"])
        .process(Count(), uid="count")
        .sink_to(sink, uid="sink")
    )
    return env.spec(), sink


async def start(
    spec: Any, clock: ManualClock | None = None
) -> tuple[JobRunner, asyncio.Task[Any], JobRun]:
    started: asyncio.Future[JobRun] = asyncio.get_running_loop().create_future()
    runner = JobRunner(spec, on_started=started.set_result, clock=clock)
    job = asyncio.create_task(runner.run())
    return runner, job, await started


async def first_run(tmp: Path) -> Any:
    """Checkpoint 1 completes while every call waits; return its metadata."""
    a, b, calls = ScriptedSource("a"), ScriptedSource("b"), asyncio.Event()
    spec, _ = build(tmp, a, b, calls)
    runner, job, run = await start(spec)
    slow = next(t for t in run.tasks if t.task_id.startswith("slow"))
    gate = slow.spec.input_gate
    assert gate is not None
    for batch in batches("a", 0, 3):
        a.queue.put_nowait(batch)
    for batch in batches("b", 0, 2):
        b.queue.put_nowait(batch)
    # a's first batch fills the calls (5) and waits for room (5): the rest stays queued
    await wait_until(lambda: a.emitted == 30 and b.emitted == 20 and gate.queue.qsize() == 4)
    b.gate.clear()  # b's barrier will come late
    await wait_until(lambda: b.parked)
    assert run.coordinator is not None
    checkpoint = run.coordinator.trigger()
    # a's barrier overtook a's two queued batches: the snapshot is taken, b's is awaited
    await wait_until(lambda: slow.metrics.last_checkpoint_sync_ms > 0)
    for batch in batches("a", 3, 2):  # behind a's barrier: not in checkpoint 1
        a.queue.put_nowait(batch)
    b.queue.put_nowait(batches("b", 2, 1)[0])  # before b's barrier: in flight
    b.gate.set()
    completed = await asyncio.wait_for(checkpoint, 10)
    assert not calls.is_set(), "completed while every call still waits"
    runner.cancel()
    await asyncio.wait_for(job, 10)
    return completed


async def test_unaligned_checkpoint_completes_past_a_full_channel_and_restores_exactly(
    tmp_path: Path,
) -> None:
    completed = await first_run(tmp_path)
    slow_task = "slow-0"
    figures = completed.tasks[slow_task]
    assert figures["unaligned"] is True
    # in the channels: a's 2 queued batches, b's 2 queued and 1 sent before its barrier
    assert figures["in_flight_records"] == 50 and figures["in_flight_bytes"] > 0
    handle = completed.subtask_states("slow")[0]["channel"]
    assert handle["channels"] == {"0": [2, 20], "1": [3, 30]}
    assert (completed.root / handle["file"]).is_file()
    # the 10 records of a's first batch are the async operator's own state
    assert len(completed.subtask_states("slow")[0]["operator"]["in_flight"]) == 10
    # the checkpoint history (REST) and `checkpoints inspect` / `list` say how it was taken
    entry = completed_entry(completed)
    assert entry["unaligned"] is True and entry["in_flight_records"] == 50
    assert entry["in_flight_bytes"] == figures["in_flight_bytes"]
    assert entry["alignment_ms_max"] == 0.0  # it waited for nothing
    inspected = inspect_checkpoint(completed.directory, None)
    assert inspected["unaligned"] is True and inspected["in_flight_records"] == 50
    assert inspected["subtask_state_bytes"]["slow"]["0"] > handle["size_bytes"]
    rows = list_checkpoints(tmp_path / "ckpt")
    assert any(r.lstrip().startswith("1 ") and "unaligned: 50 records" in r for r in rows)

    # restore: in-flight records first, then a's batches after its barrier, again
    a, b, calls = ScriptedSource("a"), ScriptedSource("b"), asyncio.Event()
    calls.set()
    spec, sink = build(tmp_path, a, b, calls)
    for batch in batches("a", 3, 2):
        a.queue.put_nowait(batch)
    a.queue.put_nowait(None)
    b.queue.put_nowait(None)
    runner = JobRunner(spec)
    result = await asyncio.wait_for(runner.run(), 30)
    assert result.status.value == "finished"
    out = sink.results
    seen = [(r["src"], r["i"]) for r in out]
    assert len(seen) == len(set(seen)) == 80  # every record once
    finals: dict[int, int] = {}
    for r in out:
        finals[r["k"]] = max(finals.get(r["k"], 0), r["n"])
    assert sum(finals.values()) == 80  # the count saw each record once
    # the replayed channel state goes before a's new input
    after = [pos for pos, (src, i) in enumerate(seen) if src == "a" and i >= 30]
    replayed = [pos for pos, (src, i) in enumerate(seen) if src == "b" or 10 <= i < 30]
    assert max(replayed) < min(after)


async def test_restore_at_another_parallelism_is_refused_naming_the_option(
    tmp_path: Path,
) -> None:
    completed = await first_run(tmp_path)
    assert completed.subtask_states("slow")[0].get("channel")
    a, b, calls = ScriptedSource("a"), ScriptedSource("b"), asyncio.Event()
    calls.set()
    spec, _ = build(tmp_path, a, b, calls, parallelism=2)
    with pytest.raises((JobFailedError, StateMigrationError)) as info:
        await asyncio.wait_for(JobRunner(spec).run(), 30)
    message = str(info.value)
    assert "checkpoint.unaligned" in message and "savepoint" in message
    # nothing was set aside: the checkpoint is fine for the old parallelism
    storage = CheckpointStorage(tmp_path / "ckpt", create=False)
    assert next(storage.completed_newest_first()) == completed.checkpoint_id
    assert read_checkpoint(completed.directory).checkpoint_id == completed.checkpoint_id


async def test_aligned_timeout_turns_a_stuck_aligned_checkpoint_unaligned(tmp_path: Path) -> None:
    """``checkpoint.aligned_timeout``: aligned while in time, unaligned after (the job's clock)."""
    a, b, calls = ScriptedSource("a"), ScriptedSource("b"), asyncio.Event()
    clock = ManualClock()
    spec, _ = build(tmp_path, a, b, calls, aligned_timeout=2.0)
    runner, job, run = await start(spec, clock)
    slow = next(t for t in run.tasks if t.task_id.startswith("slow"))
    gate = slow.spec.input_gate
    assert gate is not None and run.coordinator is not None
    for batch in batches("a", 0, 3):
        a.queue.put_nowait(batch)
    for batch in batches("b", 0, 2):
        b.queue.put_nowait(batch)
    await wait_until(lambda: a.emitted == 30 and b.emitted == 20 and gate.queue.qsize() == 4)
    checkpoint = run.coordinator.trigger()
    # both barriers wait in line behind the batches the blocked calls do not take
    await wait_until(lambda: gate.queue.qsize() == 6)
    for _ in range(200):
        await asyncio.sleep(0)
    assert not checkpoint.done() and slow.metrics.last_checkpoint_sync_ms == 0
    clock.advance(2.0)  # the timeout: unaligned from here, the barriers go ahead
    completed = await asyncio.wait_for(checkpoint, 10)
    assert not calls.is_set(), "completed while every call still waits"
    figures = completed.tasks["slow-0"]
    assert figures["unaligned"] is True and figures["alignment_ms"] == 2000.0
    assert figures["in_flight_records"] == 40  # a's 2 and b's 2 batches queued in front
    handle = completed.subtask_states("slow")[0]["channel"]
    assert handle["channels"] == {"0": [2, 20], "1": [2, 20]}
    assert not completed.tasks["a-0"]["unaligned"]  # the sources had nothing to align
    runner.cancel()
    await asyncio.wait_for(job, 10)
