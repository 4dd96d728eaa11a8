"""Unaligned checkpoints at a two-input task: both inputs in flight, replayed to their side.

A keyed ``connect`` and a broadcast ``connect`` whose task is stuck writing
to a sink the test holds: both inputs queue up behind it. Checkpoint 1's
barriers overtake them, so it holds the first batch's effect as state and
every queued batch as channel state -- the second input's as such, so a
restore hands them to ``process_element2`` / ``process_broadcast_element``
again. The restored job counts every record once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.api import (
    BroadcastProcessFunction,
    KeyedCoProcessFunction,
    StreamEnvironment,
    ValueStateDescriptor,
)
from aiostream_ckpt.connectors.collection import CollectSink
from aiostream_ckpt.jobspec.config import CheckpointConfig, JobConfig
from aiostream_ckpt.runtime.job import JobRun, JobRunner
from aiostream_ckpt.state.descriptors import MapStateDescriptor
from tests.helpers import ScriptedSource, wait_until

BATCH = 10
SEEN = MapStateDescriptor("seen", str, int)


class CountBoth(KeyedCoProcessFunction[Any, Any, Any]):
    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", default=0))

    def process_element1(self, value: Any, ctx: Any, out: Any) -> None:
        n = self.n.value() + 1
        self.n.update(n)
        out.collect({**value, "n": n, "side": 1})

    def process_element2(self, value: Any, ctx: Any, out: Any) -> None:
        n = self.n.value() + 1
        self.n.update(n)
        out.collect({**value, "n": n, "side": 2})


class SeenRules(BroadcastProcessFunction[Any, Any, Any]):
    """The broadcast side adds its ids to broadcast state and says how many it has seen."""

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        out.collect({**value, "side": 1})

    def process_broadcast_element(self, value: Any, ctx: Any, out: Any) -> None:
        seen = ctx.get_broadcast_state(SEEN)
        key = f"{value['src']}{value['i']}"
        seen.put(key, 1)
        out.collect({**value, "side": 2, "seen": len(list(seen.keys()))})


class HeldSink(CollectSink):
    """An exactly-once collecting sink whose writes wait while ``hold`` is clear."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = asyncio.Event()
        self.hold.set()

    def create_writer(self, ctx: Any) -> Any:
        writer = super().create_writer(ctx)
        write, hold = writer.write, self.hold

        async def held_write(batch: list[Any]) -> None:
            await hold.wait()
            await write(batch)

        writer.write = held_write  # type: ignore[method-assign]
        return writer


def batches(src: str, first: int, count: int) -> list[list[dict[str, Any]]]:
    return [
        [{"src": src, "i": b * BATCH + j, "k": j % 3} for j in range(BATCH)]
        for b in range(first, first + count)
    ]


def build(tmp: Path, kind: str, a: ScriptedSource, b: ScriptedSource) -> tuple[Any, HeldSink]:
    config = JobConfig(
        batch_size=BATCH,
        checkpoint=CheckpointConfig(directory=tmp / "ckpt", interval=0, unaligned=True),
    )
    env = StreamEnvironment("two", config=config)
    first, second = env.from_source(a, uid="a"), env.from_source(b, uid="b")
    sink = HeldSink()
    if kind == "keyed":
        key = lambda r: r["k"]  # noqa: E731
        out = first.connect(second).key_by(key, key).process(CountBoth(), uid="two")
    else:
        out = first.connect(second.broadcast(SEEN)).process(SeenRules(), uid="two")
    out.sink_to(sink, uid="sink")
    return env.spec(), sink


@pytest.mark.parametrize("kind", ["keyed", "broadcast"])
async def test_both_inputs_in_flight_are_replayed_to_their_side(tmp_path: Path, kind: str) -> None:
    a, b = ScriptedSource("a"), ScriptedSource("b")
    spec, sink = build(tmp_path, kind, a, b)
    started: asyncio.Future[JobRun] = asyncio.get_running_loop().create_future()
    runner = JobRunner(spec, on_started=started.set_result)
    job = asyncio.create_task(runner.run())
    run = await started
    two = next(t for t in run.tasks if t.task_id.startswith("two"))
    gate = two.spec.input_gate
    assert gate is not None and run.coordinator is not None
    sink.hold.clear()
    for batch in batches("a", 0, 3):
        a.queue.put_nowait(batch)
    for batch in batches("b", 0, 3):
        b.queue.put_nowait(batch)
    # the task took one batch and waits in the sink; the other five are queued
    await wait_until(lambda: a.emitted == b.emitted == 30 and gate.queue.qsize() == 5)
    checkpoint = run.coordinator.trigger()
    await wait_until(lambda: gate.queue.has_priority)
    sink.hold.set()
    completed = await asyncio.wait_for(checkpoint, 10)
    handle = completed.subtask_states("two")[0]["channel"]
    assert handle["records"] == 50 and completed.tasks[two.task_id]["unaligned"]
    runner.cancel()
    await asyncio.wait_for(job, 10)

    a, b = ScriptedSource("a"), ScriptedSource("b")
    a.queue.put_nowait(None)
    b.queue.put_nowait(None)
    spec, sink = build(tmp_path, kind, a, b)
    result = await asyncio.wait_for(JobRunner(spec).run(), 30)
    assert result.status.value == "finished"
    out = sink.results  # checkpoint 1's output (recovered), then the rest
    assert len(out) == 60 and len({(r["src"], r["i"]) for r in out}) == 60
    assert all((r["side"] == 1) == (r["src"] == "a") for r in out)  # each to its side
    if kind == "keyed":
        finals: dict[int, int] = {}
        for r in out:
            finals[r["k"]] = max(finals.get(r["k"], 0), r["n"])
        assert sum(finals.values()) == 60  # restored count + in flight: every record once
    else:
        # b's ids in broadcast state: restored ones, then each in-flight one once
        assert sorted(r["seen"] for r in out if r["side"] == 2) == list(range(1, 31))
