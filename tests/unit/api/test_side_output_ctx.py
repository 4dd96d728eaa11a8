"""``ctx.output(tag, value)`` from any process function: a side stream next to the main one."""

from __future__ import annotations

from typing import Any

from aiostream_ckpt.api import KeyedProcessFunction, ProcessFunction, StreamEnvironment
from aiostream_ckpt.api.functions import Collector, Context
from aiostream_ckpt.connectors.collection import CollectSink
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.jobspec.functions import OutputTag

ODD: OutputTag[int] = OutputTag("odd")


class SplitOdd(ProcessFunction[int, int]):
    def process_element(self, value: int, ctx: Context, out: Collector[int]) -> None:
        if value % 2:
            ctx.output(ODD, value)
        else:
            out.collect(value)


class FirstPerKey(KeyedProcessFunction[tuple[str, int], tuple[str, int]]):
    """Main: every record; side: the key once, when it is first seen (needs its keyed state)."""

    def open(self, ctx: Any) -> None:
        from aiostream_ckpt.api import ValueStateDescriptor

        self.seen = ctx.get_state(ValueStateDescriptor("seen", default=False))

    def process_element(self, value: Any, ctx: Context, out: Collector[Any]) -> None:
        if not self.seen.value():
            self.seen.update(True)
            ctx.output(FIRST, ctx.current_key)
        out.collect(value)


FIRST: OutputTag[str] = OutputTag("first")


def test_process_function_side_output_next_to_the_main_output() -> None:
    env = StreamEnvironment("t", config=JobConfig(batch_size=7))
    main = env.from_collection(list(range(50))).process(SplitOdd(), uid="split")
    odd = CollectSink()
    main.get_side_output(ODD).sink_to(odd, uid="odd-sink", parallelism=1)
    assert env.execute_and_collect(main) == list(range(0, 50, 2))
    assert odd.results == list(range(1, 50, 2))


def test_keyed_side_output_at_parallelism_two() -> None:
    env = StreamEnvironment("t", config=JobConfig(batch_size=5))
    events = [(f"k{i % 6}", i) for i in range(60)]
    main = env.from_collection(events).key_by(lambda e: e[0])
    main = main.process(FirstPerKey(), uid="first", parallelism=2)
    first = CollectSink()
    main.get_side_output(FIRST).sink_to(first, uid="first-sink", parallelism=1)
    out = env.execute_and_collect(main)
    assert sorted(map(tuple, out), key=lambda e: e[1]) == events
    assert sorted(first.results) == [f"k{i}" for i in range(6)]


def test_side_output_nobody_reads_is_dropped() -> None:
    env = StreamEnvironment("t")
    main = env.from_collection(list(range(10))).process(SplitOdd(), uid="split")
    assert env.execute_and_collect(main) == [0, 2, 4, 6, 8]
