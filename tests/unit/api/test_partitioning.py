"""Partitioning between stages: hash by key group, rebalance, broadcast, union."""

from __future__ import annotations

import collections

from aiostream_ckpt.api import (
    KeyedProcessFunction,
    ProcessFunction,
    StreamEnvironment,
    ValueStateDescriptor,
)


class TagSubtask(ProcessFunction):
    def open(self, ctx):
        self.subtask = ctx.subtask_index

    def process_element(self, value, ctx, out):
        out.collect((self.subtask, value))


class KeyedTag(KeyedProcessFunction):
    def open(self, ctx):
        self.subtask = ctx.subtask_index
        self.seen = ctx.get_state(ValueStateDescriptor("seen", default=0))

    def process_element(self, value, ctx, out):
        self.seen.update(self.seen.value() + 1)
        out.collect((self.subtask, ctx.current_key, self.seen.value()))


def test_hash_partitioning_keeps_each_key_on_one_instance() -> None:
    env = StreamEnvironment("hash")
    src = env.from_collection([f"k{i % 20}" for i in range(1000)])
    out = env.execute_and_collect(src.key_by(lambda k: k).process(KeyedTag(), parallelism=3))
    by_key = collections.defaultdict(set)
    for subtask, key, _ in out:
        by_key[key].add(subtask)
    assert all(len(s) == 1 for s in by_key.values())
    assert len({s for subs in by_key.values() for s in subs}) > 1, "keys spread over instances"
    finals = collections.Counter()
    for _, key, n in out:
        finals[key] = max(finals[key], n)
    assert finals == collections.Counter({f"k{i}": 50 for i in range(20)})


def test_rebalance_spreads_and_keeps_every_record() -> None:
    env = StreamEnvironment("rebalance", config=env_config(batch_size=10))
    src = env.from_collection(list(range(1000)))
    out = env.execute_and_collect(src.rebalance().process(TagSubtask(), parallelism=2))
    assert sorted(v for _, v in out) == list(range(1000))
    assert {s for s, _ in out} == {0, 1}


def test_broadcast_sends_every_record_to_every_instance() -> None:
    env = StreamEnvironment("broadcast")
    src = env.from_collection(list(range(100)))
    out = env.execute_and_collect(src.broadcast().process(TagSubtask(), parallelism=3))
    assert collections.Counter(s for s, _ in out) == {0: 100, 1: 100, 2: 100}


def test_union_and_flat_map() -> None:
    env = StreamEnvironment("union")
    a = env.from_collection([1, 2, 3])
    b = env.from_collection([10, 20]).flat_map(lambda x: [x, x + 1])
    assert sorted(env.execute_and_collect(a.union(b))) == [1, 2, 3, 10, 11, 20, 21]


def env_config(**kw):
    from aiostream_ckpt.jobspec.config import JobConfig

    return JobConfig(**kw)
