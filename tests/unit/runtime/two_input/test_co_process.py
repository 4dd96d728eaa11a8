"""``connect(...).process``: two inputs, one operator; keyed: shared state and timers per key."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from aiostream_ckpt.api import (
    CoProcessFunction,
    KeyedCoProcessFunction,
    StreamEnvironment,
    ValueStateDescriptor,
)
from aiostream_ckpt.connectors.collection import CollectionSource
from aiostream_ckpt.jobspec.config import JobConfig
from tests.unit.time.support import strategy


class CountBoth(KeyedCoProcessFunction[Any, Any, Any]):
    """One count per key over both inputs: input 1 adds 1, input 2 adds 10."""

    def open(self, ctx: Any) -> None:
        self.total = ctx.get_state(ValueStateDescriptor("total", default=0))

    def process_element1(self, value: Any, ctx: Any, out: Any) -> None:
        self.total.update(self.total.value() + 1)
        out.collect((ctx.current_key, self.total.value()))

    def process_element2(self, value: Any, ctx: Any, out: Any) -> None:
        self.total.update(self.total.value() + 10)
        out.collect((ctx.current_key, self.total.value()))


@pytest.mark.parametrize("parallelism", [1, 3])
def test_keyed_inputs_share_state_per_key(parallelism: int) -> None:
    env = StreamEnvironment("t", config=JobConfig(batch_size=4))
    a = env.from_collection([{"k": f"k{i % 5}"} for i in range(50)])
    b = env.from_collection([(f"k{i % 5}", i) for i in range(20)])
    joined = a.connect(b).key_by(lambda e: e["k"], lambda t: t[0])
    out = env.execute_and_collect(joined.process(CountBoth(), uid="both", parallelism=parallelism))
    finals: dict[str, int] = {}
    for k, total in out:
        finals[k] = max(finals.get(k, 0), total)
    assert finals == {f"k{i}": 10 * 1 + 40 for i in range(5)}  # 10 of a, 4 of b per key
    assert len(out) == 70


class TimerPerKey(KeyedCoProcessFunction[Any, Any, Any]):
    def process_element1(self, value: Any, ctx: Any, out: Any) -> None:
        ctx.timer_service().register_event_time_timer(value["ts"] + 100)

    def process_element2(self, value: Any, ctx: Any, out: Any) -> None:
        out.collect(("b", ctx.current_key))

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        out.collect(("timer", ctx.current_key, timestamp))


def test_keyed_co_process_timers_fire_per_key() -> None:
    env = StreamEnvironment("t", config=JobConfig(batch_size=3))
    events = [{"k": f"k{i % 3}", "ts": i * 10} for i in range(12)]
    a = env.from_source(CollectionSource(events), uid="a", watermark_strategy=strategy())
    b = env.from_collection([{"k": "k0", "ts": 0}], uid="b")
    out = env.execute_and_collect(
        a.connect(b).key_by(lambda e: e["k"], lambda e: e["k"]).process(TimerPerKey(), uid="t")
    )
    timers = Counter(o for o in out if o[0] == "timer")
    assert timers == Counter(("timer", e["k"], e["ts"] + 100) for e in events)
    assert ("b", "k0") in out


class Plain(CoProcessFunction[int, str, Any]):
    def process_element1(self, value: int, ctx: Any, out: Any) -> None:
        out.collect(value * 2)

    def process_element2(self, value: str, ctx: Any, out: Any) -> None:
        ctx.output(ODD, value)  # side outputs work from co functions too


from aiostream_ckpt.jobspec.functions import OutputTag  # noqa: E402

ODD: OutputTag[str] = OutputTag("letters")


def test_non_keyed_connect_and_a_side_output() -> None:
    from aiostream_ckpt.connectors.collection import CollectSink

    env = StreamEnvironment("t", config=JobConfig(batch_size=2))
    a = env.from_collection([1, 2, 3])
    b = env.from_collection(["x", "y"])
    main = a.connect(b).process(Plain(), uid="plain")
    letters = CollectSink()
    main.get_side_output(ODD).sink_to(letters, uid="letters", parallelism=1)
    assert sorted(env.execute_and_collect(main)) == [2, 4, 6]
    assert sorted(letters.results) == ["x", "y"]


def test_keyed_function_without_key_by_is_refused() -> None:
    env = StreamEnvironment("t")
    a, b = env.from_collection([1]), env.from_collection([2])
    with pytest.raises(TypeError, match="key_by"):
        a.connect(b).process(CountBoth())
