"""Windows: out-of-order equals sorted, allowed lateness, the late side output, and
session windows merging across a checkpoint."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.collection import CollectionSource, CollectSink
from aiostream_ckpt.connectors.staging import read_committed_output
from aiostream_ckpt.time import (
    AggregateFunction,
    EventTimeSessionWindows,
    OutputTag,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowAssigner,
)
from apps import transitions_per_hour as app
from tests.helpers import wait_until
from tests.unit.time.support import SplitSource, config, start, strategy


class Sum(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, accumulator):
        return accumulator + value["v"]

    def get_result(self, accumulator):
        return accumulator

    def merge(self, a, b):
        return a + b


class Describe(ProcessWindowFunction):
    """(key, start, end, payload): payload is the aggregate, or the sorted timestamps."""

    def process(self, key, context, elements, out):
        items = list(elements)
        if items and isinstance(items[0], dict):
            items = sorted(e["ts"] for e in items)
        w = context.window
        out.collect((key, w.start, w.end, items[0] if len(items) == 1 else tuple(items)))


class ReduceDescribe(ProcessWindowFunction):
    def process(self, key, context, elements, out):
        for e in elements:
            out.collect((key, context.window.start, context.window.end, e["v"]))


def _events(n: int, *, seed: int, max_delay: int) -> tuple[list[dict[str, Any]], list[Any]]:
    """``n`` events sorted by time, and the same arriving at most ``max_delay`` out of order."""
    rng = random.Random(seed)
    t, events = 0, []
    for i in range(n):
        t += rng.randint(0, 400)
        events.append({"k": f"k{rng.randrange(4)}", "ts": t, "v": i % 7})
    jittered = sorted(events, key=lambda e: e["ts"] + rng.uniform(0, max_delay))
    return events, jittered


def _run(tmp: Path, events: list[Any], assigner: WindowAssigner, kind: str) -> list[Any]:
    env = StreamEnvironment("w", config=config(tmp, batch_size=5))
    keyed = env.from_source(
        CollectionSource(events), uid="src", watermark_strategy=strategy(max_delay=2_000)
    ).key_by(lambda e: e["k"])
    windowed = keyed.window(assigner)
    if kind == "aggregate":
        out = windowed.aggregate(Sum(), Describe(), uid="win")
    elif kind == "reduce":
        out = windowed.reduce(lambda a, b: {**b, "v": a["v"] + b["v"]}, ReduceDescribe(), uid="win")
    else:
        out = windowed.process(Describe(), uid="win")
    return env.execute_and_collect(out)


def _expected(events: list[Any], assigner: WindowAssigner) -> Counter[Any]:
    """Aggregate results by brute force (sessions: sort and split on gaps)."""
    got: Counter[Any] = Counter()
    if isinstance(assigner, EventTimeSessionWindows):
        by_key: dict[str, list[Any]] = {}
        for e in sorted(events, key=lambda e: e["ts"]):
            by_key.setdefault(e["k"], []).append(e)
        for k, evs in by_key.items():
            start, total, last = evs[0]["ts"], 0, evs[0]["ts"]
            for e in evs:
                if e["ts"] > last + assigner.gap:
                    got[(k, start, last + assigner.gap, total)] += 1
                    start, total = e["ts"], 0
                total += e["v"]
                last = e["ts"]
            got[(k, start, last + assigner.gap, total)] += 1
        return got
    sums: Counter[Any] = Counter()
    for e in events:
        for w in assigner.assign(e["ts"]):
            sums[(e["k"], w.start, w.end)] += e["v"]
    return Counter((*k, v) for k, v in sums.items())


ASSIGNERS = {
    "tumbling": TumblingEventTimeWindows.of(5_000),
    "sliding": SlidingEventTimeWindows.of(6_000, 2_000),
    "session": EventTimeSessionWindows.with_gap(700),
}


@pytest.mark.parametrize("name", list(ASSIGNERS))
@pytest.mark.parametrize("kind", ["aggregate", "reduce", "process"])
def test_out_of_order_equals_sorted(tmp_path: Path, name: str, kind: str) -> None:
    assigner = ASSIGNERS[name]
    ordered, shuffled = _events(400, seed=hash(name) % 100, max_delay=2_000)
    a = _run(tmp_path / "a", ordered, assigner, kind)
    b = _run(tmp_path / "b", shuffled, assigner, kind)
    assert Counter(a) == Counter(b)
    if kind != "process":
        assert Counter(a) == _expected(ordered, assigner)
    assert len(a) == len(set(a)), "each window fires once: nothing was late"


def test_allowed_lateness_refires_and_late_records_go_to_the_side_output(tmp_path: Path) -> None:
    late = OutputTag("late")
    env = StreamEnvironment("late", config=config(tmp_path, batch_size=1))
    events = [
        {"k": "a", "ts": 1_000, "v": 1},
        {"k": "a", "ts": 15_000, "v": 10},  # watermark 14 999: [0, 10 s) fires with 1
        {"k": "a", "ts": 5_000, "v": 2},  # late but within 10 s lateness: fires again with 3
        {"k": "b", "ts": 19_000, "v": 5},
        {"k": "a", "ts": 30_000, "v": 100},  # watermark 29 999: [0, 10 s) is dropped
        {"k": "a", "ts": 2_000, "v": 1000},  # too late: side output only
        {"k": "b", "ts": 12_000, "v": 7},  # [10, 20 s) is past its lateness too
    ]
    windowed = (
        env.from_source(CollectionSource(events), uid="src", watermark_strategy=strategy())
        .key_by(lambda e: e["k"])
        .window(TumblingEventTimeWindows.of(10_000))
        .allowed_lateness(10_000)
        .side_output_late_data(late)
        .aggregate(Sum(), Describe(), uid="win")
    )
    late_sink = CollectSink(name="late")
    windowed.get_side_output(late).sink_to(late_sink, uid="late-sink")
    main = env.execute_and_collect(windowed)
    assert main == [
        ("a", 0, 10_000, 1),
        ("a", 0, 10_000, 3),
        ("a", 10_000, 20_000, 10),
        ("b", 10_000, 20_000, 5),
        ("a", 30_000, 40_000, 100),
    ]
    assert late_sink.results == [events[-2], events[-1]]


def test_a_batch_refires_due_windows_per_record_and_folds_the_others(tmp_path: Path) -> None:
    # one batch holds records of a window past its end (each fires it again, with
    # itself added) and of a current one (folded, fired once by the watermark)
    env = StreamEnvironment("batch", config=config(tmp_path, batch_size=4))
    events = [
        {"k": "a", "ts": 1_000, "v": 1},
        {"k": "a", "ts": 15_000, "v": 10},
        {"k": "b", "ts": 3_000, "v": 100},
        {"k": "b", "ts": 15_500, "v": 1000},  # watermark 15 499: both [0, 10 s) fire
        {"k": "a", "ts": 5_000, "v": 2},
        {"k": "a", "ts": 16_000, "v": 20},
        {"k": "a", "ts": 6_000, "v": 3},
        {"k": "a", "ts": 17_000, "v": 30},
    ]
    s = (
        env.from_source(CollectionSource(events), uid="src", watermark_strategy=strategy())
        .key_by(lambda e: e["k"])
        .window(TumblingEventTimeWindows.of(10_000))
        .allowed_lateness(10_000)
        .aggregate(Sum(), Describe(), uid="win")
    )
    assert env.execute_and_collect(s) == [
        ("a", 0, 10_000, 1),
        ("b", 0, 10_000, 100),
        ("a", 0, 10_000, 3),
        ("a", 0, 10_000, 6),
        ("a", 10_000, 20_000, 60),
        ("b", 10_000, 20_000, 1000),
    ]


def test_late_records_without_a_side_output_are_dropped(tmp_path: Path) -> None:
    env = StreamEnvironment("drop", config=config(tmp_path, batch_size=1))
    events = [{"k": "a", "ts": 1_000, "v": 1}, {"k": "a", "ts": 20_000, "v": 2}]
    events.append({"k": "a", "ts": 500, "v": 4})
    s = (
        env.from_source(CollectionSource(events), uid="src", watermark_strategy=strategy())
        .key_by(lambda e: e["k"])
        .window(TumblingEventTimeWindows.of(10_000))
        .aggregate(Sum(), uid="win")
    )
    assert env.execute_and_collect(s) == [1, 2]


@pytest.mark.parametrize("kind", ["aggregate", "process"])
async def test_session_merge_across_a_checkpoint(tmp_path: Path, kind: str) -> None:
    """Sessions [0, 100) and [300, 400); 100 joins the first, checkpoint, restore, 200 bridges."""

    def build(directory: Path) -> tuple[StreamEnvironment, SplitSource, CollectSink]:
        env = StreamEnvironment("sessions", config=config(directory))
        src, sink = SplitSource("src", ["s"]), CollectSink()
        windowed = (
            env.from_source(src, uid="src", watermark_strategy=strategy(max_delay=10_000))
            .key_by(lambda e: e["k"])
            .window(EventTimeSessionWindows.with_gap(100))
        )
        out = (
            windowed.aggregate(Sum(), Describe(), uid="win")
            if kind == "aggregate"
            else windowed.process(Describe(), uid="win")
        )
        out.sink_to(sink, uid="sink")
        return env, src, sink

    def ev(ts: int) -> dict[str, Any]:
        return {"k": "u", "ts": ts, "v": ts}

    env, src, sink = build(tmp_path)
    job, run, runner = await start(env)
    src.feed("s", [ev(0), ev(300), ev(100)])
    await wait_until(lambda: run.tasks[0].metrics.records_in == 3)
    assert run.coordinator is not None
    await run.coordinator.trigger()
    runner.cancel()
    await asyncio.wait_for(job, 30)
    assert sink.results == []

    env, src, sink = build(tmp_path)
    job, _, _ = await start(env)
    src.feed("s", [ev(200)])
    src.end()
    await asyncio.wait_for(job, 30)

    env2, src2, reference = build(tmp_path / "failure-free")
    job2, _, _ = await start(env2)
    src2.feed("s", [ev(0), ev(300), ev(100), ev(200)])
    src2.end()
    await asyncio.wait_for(job2, 30)
    payload = 600 if kind == "aggregate" else (0, 100, 200, 300)
    assert sink.results == reference.results == [("u", 0, 400, payload)]


def test_transitions_app_out_of_order_equals_sorted(tmp_path: Path) -> None:
    events = app.generate_events(3_000, users=8, max_delay=120_000, seed=5, step_ms=5_000)
    results = []
    for name, evs in (("shuffled", events), ("sorted", sorted(events, key=lambda e: e["ts"]))):
        inp = app.write_events(tmp_path / f"{name}.jsonl", evs)
        out = tmp_path / f"out-{name}"
        params = {"input": str(inp), "output": str(out), "max_delay": 120_000}
        env = StreamEnvironment("tph", config=config(tmp_path / name, batch_size=64), params=params)
        app.build(env)
        env.execute()
        results.append(
            Counter(
                (r["user_id"], r["hour_start"], r["transitions"])
                for r in read_committed_output(out)
            )
        )
    want = Counter((u, h, n) for (u, h), n in app.expected_transitions(events).items())
    assert results[0] == results[1] == want
