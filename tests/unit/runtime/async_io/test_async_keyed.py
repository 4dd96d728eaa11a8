"""``key_by(...).map_async(KeyedAsyncFunction)``: keyed state per key, one call per key."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from aiostream_ckpt.api import (
    AsyncFunction,
    AsyncRetry,
    KeyedAsyncFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    RuntimeContext,
    StreamEnvironment,
    ValueStateDescriptor,
)
from aiostream_ckpt.errors import JobFailedError, JobGraphError
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.state.descriptors import StateDescriptor

SEEN = ValueStateDescriptor("seen", int, default=0)


class Numbered(KeyedAsyncFunction[dict[str, Any], tuple[str, int, int]]):
    """Numbers each key's records; tracks how many calls of one key run at once.

    The tracking is on the class: each instance runs a deep copy of the function.
    """

    running: Counter[str] = Counter()
    most_per_key = 0
    most = 0

    async def open(self, ctx: RuntimeContext) -> None:
        self.seen = ctx.get_state(SEEN)

    async def invoke(self, value: dict[str, Any]) -> tuple[str, int, int]:
        k, cls = value["k"], Numbered
        cls.running[k] += 1
        cls.most_per_key = max(cls.most_per_key, cls.running[k])
        cls.most = max(cls.most, sum(cls.running.values()))
        n = self.seen.value() + 1
        await asyncio.sleep(0.001 * (value["i"] % 3))  # completions out of input order
        self.seen.update(n)
        cls.running[k] -= 1
        return (k, value["i"], n)


@pytest.mark.parametrize("ordered", [True, False])
def test_each_key_numbered_in_input_order_one_call_per_key(ordered: bool) -> None:
    Numbered.running, Numbered.most_per_key, Numbered.most = Counter(), 0, 0
    env = StreamEnvironment("t", config=JobConfig(batch_size=32))
    events = [{"k": f"k{i % 6}", "i": i} for i in range(240)]
    s = env.from_collection(events).key_by(lambda e: e["k"])
    out = env.execute_and_collect(s.map_async(Numbered(), capacity=8, ordered=ordered, uid="n"))
    by_key: dict[str, list[tuple[int, int]]] = {}
    for k, i, n in out:
        by_key.setdefault(k, []).append((i, n))
    for k, rows in by_key.items():
        rows.sort()
        assert [n for _, n in rows] == list(range(1, len(rows) + 1)), k
    assert len(out) == 240
    assert Numbered.most_per_key == 1  # a key's next call waits for the previous result
    assert Numbered.most > 1  # calls of different keys overlap


class FailsFirst(KeyedAsyncFunction[int, int]):
    """Writes, then fails on the first attempt of every record: its write must not count."""

    async def open(self, ctx: RuntimeContext) -> None:
        self.seen = ctx.get_state(SEEN)
        self.attempts: Counter[int] = Counter()

    async def invoke(self, value: int) -> int:
        n = self.seen.value() + 1
        self.seen.update(n)
        self.attempts[value] += 1
        if self.attempts[value] == 1:
            raise ConnectionError("first attempt")
        return n


def test_a_failed_attempt_leaves_no_write() -> None:
    env = StreamEnvironment("t")
    s = env.from_collection([1, 2, 3, 4]).key_by(lambda v: "one key")
    retry = AsyncRetry(attempts=2, delay=0)
    out = env.execute_and_collect(s.map_async(FailsFirst(), retry=retry, uid="f"))
    assert out == [1, 2, 3, 4]


class Mutates(KeyedAsyncFunction[int, list[int]]):
    async def open(self, ctx: RuntimeContext) -> None:
        self.items = ctx.get_state(ValueStateDescriptor("items", list[int], default=[]))

    async def invoke(self, value: int) -> list[int]:
        items = self.items.value()
        items.append(value)  # in place: only the update() below may reach the state
        if value % 2:
            self.items.update(items)
        return self.items.value()


def test_reads_see_own_writes_and_in_place_changes_do_not_leak() -> None:
    env = StreamEnvironment("t")
    s = env.from_collection([1, 2, 3, 4, 5]).key_by(lambda v: 0)
    out = env.execute_and_collect(s.map_async(Mutates(), uid="m"))
    assert out == [[1], [1], [1, 3], [1, 3], [1, 3, 5]]


class UnknownKind(KeyedAsyncFunction[int, int]):
    async def open(self, ctx: RuntimeContext) -> None:
        ctx.get_state(StateDescriptor("s"))


class OutsideInvoke(KeyedAsyncFunction[int, int]):
    async def open(self, ctx: RuntimeContext) -> None:
        ctx.get_state(SEEN).value()


def test_misuse_is_refused_with_the_cause() -> None:
    env = StreamEnvironment("t")
    with pytest.raises(JobGraphError, match="run it on a keyed stream"):
        env.from_collection([1]).map_async(Numbered())
    for fn, why in [
        (UnknownKind(), "keeps value, list, map or reducing state"),
        (OutsideInvoke(), "inside invoke"),
    ]:
        env = StreamEnvironment("t")
        s = env.from_collection([1]).key_by(lambda v: v).map_async(fn, uid="x")
        with pytest.raises(JobFailedError, match=why):
            env.execute_and_collect(s)


class OpenedOnce(AsyncFunction[int, int]):
    opened: list[int] = []

    async def open(self, ctx: RuntimeContext) -> None:
        self.subtask = ctx.subtask_index
        OpenedOnce.opened.append(id(self))

    async def invoke(self, value: int) -> int:
        return self.subtask


def test_each_instance_gets_its_own_function_object() -> None:
    """Opening one shared object twice gave both instances the last open's session/state."""
    OpenedOnce.opened = []
    env = StreamEnvironment("t")
    s = env.from_collection(list(range(50))).key_by(lambda v: f"k{v}")
    out = env.execute_and_collect(s.map_async(OpenedOnce(), uid="o", parallelism=2))
    assert len(set(OpenedOnce.opened)) == 2
    assert set(out) == {0, 1}


class EachKind(KeyedAsyncFunction[int, Any]):
    """Scripted writes per record: what a call reads before and after writing."""

    async def open(self, ctx: RuntimeContext) -> None:
        self.list = ctx.get_state(ListStateDescriptor("l", int))
        self.map = ctx.get_state(MapStateDescriptor("m", str, int))
        self.sum = ctx.get_state(ReducingStateDescriptor("s", int, reduce_fn=lambda a, b: a + b))

    def read(self) -> tuple[list[int], list[tuple[str, int]], int | None, bool]:
        return self.list.get(), sorted(self.map.items()), self.sum.get(), self.map.is_empty()

    async def invoke(self, value: int) -> Any:
        before = self.read()
        await asyncio.sleep(0)
        if value == 1:
            self.list.add(1)
            self.map.put("a", 1)
            self.map.put("b", 1)
            self.sum.add(1)
        elif value == 2:
            self.list.add_all([2, 20])
            self.map.remove("a")
            self.map.put("c", 2)
            self.sum.add(2)
            self.sum.add(3)
        elif value == 3:
            self.list.update([3])
            self.list.add(30)
            self.map.clear()
            self.map.put("d", 3)
            self.sum.clear()
            self.sum.add(5)
        else:
            self.list.clear()
            self.map.remove("d")
            self.sum.clear()
        flags = (self.map.contains("a"), self.map.get("c"), list(self.map.keys()))
        return before, self.read(), flags


def test_list_map_and_reducing_state_read_own_writes_and_apply_them_on_emission() -> None:
    env = StreamEnvironment("t")
    s = env.from_collection([1, 2, 3, 4]).key_by(lambda v: "one key")
    out = env.execute_and_collect(s.map_async(EachKind(), capacity=4, uid="k"))
    after = [
        ([1], [("a", 1), ("b", 1)], 1, False),
        ([1, 2, 20], [("b", 1), ("c", 2)], 6, False),
        ([3, 30], [("d", 3)], 5, False),
        ([], [], None, True),
    ]
    assert [b for b, _, _ in out] == [([], [], None, True), *after[:3]]  # the emitted writes
    assert [a for _, a, _ in out] == after  # its own writes, within the call
    assert [f for _, _, f in out] == [
        (True, None, ["a", "b"]),
        (False, 2, ["b", "c"]),
        (False, None, ["d"]),
        (False, None, []),
    ]


class FailsFirstEachKind(KeyedAsyncFunction[int, Any]):
    """Writes every kind, then fails on each record's first attempt: those writes must not count."""

    async def open(self, ctx: RuntimeContext) -> None:
        self.list = ctx.get_state(ListStateDescriptor("l", int))
        self.map = ctx.get_state(MapStateDescriptor("m", int, int))
        self.sum = ctx.get_state(ReducingStateDescriptor("s", int, reduce_fn=lambda a, b: a + b))
        self.attempts: Counter[int] = Counter()

    async def invoke(self, value: int) -> Any:
        self.list.add(value)
        self.map.put(value, value)
        self.sum.add(value)
        self.attempts[value] += 1
        if self.attempts[value] == 1:
            self.list.clear()  # a failed clear must not clear either
            raise ConnectionError("first attempt")
        return self.list.get(), sorted(self.map.keys()), self.sum.get()


def test_a_failed_attempt_leaves_no_write_of_any_kind() -> None:
    env = StreamEnvironment("t")
    s = env.from_collection([1, 2, 3]).key_by(lambda v: "one key")
    retry = AsyncRetry(attempts=2, delay=0)
    out = env.execute_and_collect(s.map_async(FailsFirstEachKind(), retry=retry, uid="f"))
    assert out == [([1], [1], 1), ([1, 2], [1, 2], 3), ([1, 2, 3], [1, 2, 3], 6)]


class InPlace(KeyedAsyncFunction[int, Any]):
    """Changes read values in place, and folds with a reduce_fn that changes its accumulator."""

    async def open(self, ctx: RuntimeContext) -> None:
        self.list = ctx.get_state(ListStateDescriptor("l", list[int]))
        self.map = ctx.get_state(MapStateDescriptor("m", str, list[int]))
        self.acc = ctx.get_state(
            ReducingStateDescriptor("acc", list[int], reduce_fn=lambda a, b: a.extend(b) or a)
        )

    async def invoke(self, value: int) -> Any:
        for xs in self.list.get():
            xs.append(-1)  # not written back: must not reach the state
        self.map.get("k", [0]).append(-1)
        self.list.add([value])
        self.map.put("k", [value])
        self.acc.add([value])
        self.acc.get().append(-1)
        return self.list.get(), self.map.get("k"), self.acc.get()


def test_in_place_changes_of_read_values_do_not_reach_the_state() -> None:
    env = StreamEnvironment("t")
    s = env.from_collection([1, 2]).key_by(lambda v: 0)
    out = env.execute_and_collect(s.map_async(InPlace(), uid="i"))
    assert out == [([[1]], [1], [1]), ([[1], [2]], [2], [1, 2])]
