"""Interval join: a nested loop's pairs, late records out, state bounded by the watermark."""

from __future__ import annotations

import random
from typing import Any

import pytest

from aiostream_ckpt.api import KeyedProcessFunction, StreamEnvironment
from aiostream_ckpt.connectors.collection import CollectionSource
from aiostream_ckpt.errors import JobGraphError
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.jobspec.interval_join import IntervalJoinFunction
from aiostream_ckpt.state.descriptors import MapStateDescriptor
from aiostream_ckpt.testing.harness import KeyedFunctionHarness
from aiostream_ckpt.time import OutputTag, ProcessJoinFunction, WatermarkStrategy

WMS = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(lambda e: e["ts"])


class Pair(ProcessJoinFunction[Any, Any, Any]):
    def process_element(self, left: Any, right: Any, ctx: Any, out: Any) -> None:
        assert (ctx.left_timestamp, ctx.right_timestamp) == (left["ts"], right["ts"])
        out.collect((ctx.current_key, left["id"], right["id"], ctx.timestamp))


def _events(rng: random.Random, side: str, n: int) -> list[dict[str, Any]]:
    ts = 0
    out = []
    for i in range(n):
        ts += rng.randint(0, 15)
        out.append({"id": f"{side}{i}", "k": f"k{rng.randrange(4)}", "ts": ts})
    return out


def _nested_loop(left: list[Any], right: list[Any], lo: int, hi: int) -> list[Any]:
    return sorted(
        (a["k"], a["id"], b["id"], max(a["ts"], b["ts"]))
        for a in left
        for b in right
        if a["k"] == b["k"] and a["ts"] + lo <= b["ts"] <= a["ts"] + hi
    )


@pytest.mark.parametrize(("parallelism", "exclusive"), [(1, False), (3, False), (2, True)])
def test_pairs_are_those_of_a_nested_loop(parallelism: int, exclusive: bool) -> None:
    rng = random.Random(parallelism)
    left, right = _events(rng, "l", 400), _events(rng, "r", 300)
    env = StreamEnvironment("t", config=JobConfig(batch_size=16))
    a = env.from_source(CollectionSource(left), uid="l", watermark_strategy=WMS)
    b = env.from_source(CollectionSource(right), uid="r", watermark_strategy=WMS)
    join = a.key_by(lambda e: e["k"]).interval_join(b.key_by(lambda e: e["k"])).between(-20, 30)
    if exclusive:
        join = join.lower_bound_exclusive().upper_bound_exclusive()
    out = env.execute_and_collect(join.process(Pair(), uid="j", parallelism=parallelism))
    lo, hi = (-19, 29) if exclusive else (-20, 30)
    assert sorted(out) == _nested_loop(left, right, lo, hi)
    assert len(out) > 100


class Sides(KeyedProcessFunction[tuple[str, Any], Any]):
    """Feeds ``("L", rec)``/``("R", rec)`` to the join's two inputs, for the harness."""

    def __init__(self, join: IntervalJoinFunction) -> None:
        self.join = join

    def open(self, ctx: Any) -> None:
        self.join.open(ctx)

    def process_element(self, value: tuple[str, Any], ctx: Any, out: Any) -> None:
        side, rec = value
        pe = self.join.process_element1 if side == "L" else self.join.process_element2
        pe(rec, ctx, out)

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        self.join.on_timer(timestamp, ctx, out)


_LEFT = MapStateDescriptor("interval-join-left", int)
_RIGHT = MapStateDescriptor("interval-join-right", int)
LATE_L, LATE_R = OutputTag[Any]("late-left"), OutputTag[Any]("late-right")


def harness(restore_from: Any = None) -> KeyedFunctionHarness[Any, Any]:
    ts = (lambda e: e["ts"], lambda e: e["ts"])
    join = IntervalJoinFunction(Pair(), -5, 10, ts, late=(LATE_L, LATE_R))
    return KeyedFunctionHarness(
        Sides(join), key_selector=lambda v: v[1]["k"], restore_from=restore_from
    )


def rec(side: str, i: int, ts: int) -> tuple[str, dict[str, Any]]:
    return side, {"id": f"{side}{i}", "k": "k", "ts": ts}


def test_late_records_join_nothing_and_go_to_their_side_output() -> None:
    h = harness()
    h.process_element(rec("L", 1, 100))
    h.process_watermark(100)
    h.process_element(rec("R", 1, 100))  # at the watermark: late, though in range of L1
    h.process_element(rec("L", 2, 95))
    h.process_element(rec("R", 2, 105))  # on time: joins L1 (100 - 5 <= ... <= 100 + 10)
    assert h.output() == [("k", "L1", "R2", 105)]
    assert h.side_output(LATE_R) == [rec("R", 1, 100)[1]]
    assert h.side_output(LATE_L) == [rec("L", 2, 95)[1]]
    h.close()


def test_kept_records_are_dropped_once_the_watermark_passes_their_reach() -> None:
    h = harness()
    for i, ts in enumerate(range(0, 200, 10)):
        h.process_element(rec("L", i, ts))
        h.process_element(rec("R", i, ts + 3))
    assert h.keys("interval-join-left") == ["k"]
    kept = h.state(_LEFT, key="k")
    assert len(list(kept.keys())) == 20
    h.process_watermark(150)
    # a left record at a is kept until the watermark reaches a + 10 (upper): every right
    # record it could still meet is then late; so 140 is gone, 150 stays
    assert sorted(kept.keys()) == [150, 160, 170, 180, 190]
    # a right record at b until b + 5 (-lower): 143 is gone (148 <= 150), 153 stays
    assert sorted(h.state(_RIGHT, key="k").keys()) == [153, 163, 173, 183, 193]
    h.process_watermark(10_000)
    assert h.keys("interval-join-left") == [] and h.keys("interval-join-right") == []
    assert h.pending_timers() == (0, 0)
    h.close()


def test_kept_records_and_their_timers_survive_a_restore() -> None:
    h = harness()
    h.process_element(rec("L", 1, 100))
    h.process_element(rec("R", 1, 96))  # joins L1
    h.process_watermark(90)
    snap = h.snapshot()
    h.close()
    restored = harness(restore_from=snap)
    restored.process_element(rec("R", 2, 110))  # joins the restored L1 (upper bound 110)
    restored.process_element(rec("L", 2, 99))  # joins the restored R1 (96 - 99 = -3 >= -5)
    assert sorted(restored.output()) == [("k", "L1", "R2", 110), ("k", "L2", "R1", 99)]
    restored.process_watermark(1_000)  # the restored cleanup timers fire
    assert restored.keys("interval-join-left") == []
    assert restored.pending_timers() == (0, 0)
    restored.close()


def test_bounds_are_checked() -> None:
    env = StreamEnvironment("t")
    a = env.from_source(CollectionSource([]), uid="a", watermark_strategy=WMS).key_by(str)
    b = env.from_source(CollectionSource([]), uid="b", watermark_strategy=WMS).key_by(str)
    with pytest.raises(JobGraphError, match="lower bound 5 > upper bound 4"):
        a.interval_join(b).between(5, 4).process(Pair())
    with pytest.raises(JobGraphError, match="lower bound 1 > upper bound 0"):
        a.interval_join(b).between(0, 0).lower_bound_exclusive().process(Pair())
    with pytest.raises(JobGraphError, match=r"ms \(int\) or a timedelta"):
        a.interval_join(b).between("1s", 4)  # type: ignore[arg-type]
    with pytest.raises(JobGraphError, match="other stream keyed too"):
        a.interval_join(env.from_collection([1], uid="q"))  # type: ignore[arg-type]
    plain = env.from_collection([1], uid="p").key_by(str)
    with pytest.raises(JobGraphError, match="no watermark strategy"):
        a.interval_join(plain).between(0, 1).process(Pair())


class TuplePair(ProcessJoinFunction[Any, Any, Any]):
    def process_element(self, left: Any, right: Any, ctx: Any, out: Any) -> None:
        out.collect((left, right))


def test_declared_record_types_are_kept_as_such() -> None:
    """Tuples would not read back from untyped state: left_type/right_type declare them."""
    wms = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(lambda e: e[1])
    env = StreamEnvironment("t", config=JobConfig(batch_size=1))
    a = env.from_source(CollectionSource([("k", 10), ("k", 20)]), uid="a", watermark_strategy=wms)
    b = env.from_source(CollectionSource([("k", 12)]), uid="b", watermark_strategy=wms)
    joined = (
        a.key_by(lambda e: e[0])
        .interval_join(b.key_by(lambda e: e[0]))
        .between(-10, 10)
        .process(TuplePair(), uid="t", left_type=tuple[str, int], right_type=tuple[str, int])
    )
    assert sorted(env.execute_and_collect(joined)) == [
        (("k", 10), ("k", 12)),
        (("k", 20), ("k", 12)),
    ]
