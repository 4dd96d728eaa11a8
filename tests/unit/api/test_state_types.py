"""Keyed state is typed by its descriptor: mypy checks this file (``files`` in pyproject).

``assert_type`` fails mypy unless the getter's type is exactly the one named,
so an untyped (``Any``) getter fails too; at run time the test runs the
function and checks what each state kept.
"""

from __future__ import annotations

import re
from typing import Any, Optional, assert_type

import pytest

from aiostream_ckpt.api import ListState, MapState, ReducingState, ValueState
from aiostream_ckpt.api.functions import Collector, Context, KeyedProcessFunction, RuntimeContext
from aiostream_ckpt.state.codecs import StateTypeError
from aiostream_ckpt.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from aiostream_ckpt.testing import KeyedFunctionHarness

COUNT = ValueStateDescriptor("count", int, default=0)
LAST = ValueStateDescriptor("last", str)
SEEN = ListStateDescriptor("seen", str)
BY_NAME = MapStateDescriptor("by-name", str, tuple[int, float])
LONGEST = ReducingStateDescriptor("longest", str, reduce_fn=lambda a, b: max(a, b, key=len))


class Typed(KeyedProcessFunction[str, tuple[int, str | None, list[str], int, str | None]]):
    def open(self, ctx: RuntimeContext) -> None:
        self.count = assert_type(ctx.get_state(COUNT), ValueState[int])
        self.last = assert_type(ctx.get_state(LAST), ValueState[str | None])  # no default
        self.seen = assert_type(ctx.get_state(SEEN), ListState[str])
        self.by_name = assert_type(ctx.get_state(BY_NAME), MapState[str, tuple[int, float]])
        self.longest = assert_type(ctx.get_reducing_state(LONGEST), ReducingState[str])
        untyped = ctx.get_state(ValueStateDescriptor("untyped"))
        assert_type(untyped, ValueState[Any])

    def process_element(
        self,
        value: str,
        ctx: Context,
        out: Collector[tuple[int, str | None, list[str], int, str | None]],
    ) -> None:
        before = self.last.value()
        self.count.update(self.count.value() + 1)
        self.last.update(value)
        self.seen.add(value)
        entry = self.by_name.get(value, (0, 0.0))
        self.by_name.put(value, (entry[0] + 1, entry[1] + 0.5))
        self.longest.add(value)
        counted = assert_type(self.by_name.get(value), tuple[int, float] | None)
        assert counted is not None
        out.collect((self.count.value(), before, self.seen.get(), counted[0], self.longest.get()))


def test_typed_states_keep_what_the_function_wrote() -> None:
    h = KeyedFunctionHarness(Typed(), key_selector=lambda v: v[0])
    try:
        for word in ("ab", "abc", "ab"):
            h.process_element(word)
        assert h.output() == [
            (1, None, ["ab"], 1, "ab"),
            (2, "ab", ["ab", "abc"], 1, "abc"),
            (3, "abc", ["ab", "abc", "ab"], 2, "abc"),
        ]
        assert h.state(BY_NAME, key="a").get("ab") == (2, 1.0)
    finally:
        h.close()


def test_broadcast_state_is_typed_by_its_descriptor_and_needs_a_broadcast_function() -> None:
    ctx = Context()
    with pytest.raises(TypeError, match="broadcast state needs a"):
        assert_type(ctx.get_broadcast_state(BY_NAME), MapState[str, tuple[int, float]])


# Optional types: ``X | None`` (or ``Optional[X]``) is the state's type, None included,
# for every kind of state; before, a value state of a union was ``Any``, a list, map or
# reducing state of ``int | None`` claimed ``int`` and ``Optional[int]`` did not type-check.
MAYBE = ValueStateDescriptor("maybe", int | None)
MAYBE_DEFAULT = ValueStateDescriptor("maybe-default", Optional[int], default=-1)  # noqa: UP045
MAYBES = ListStateDescriptor("maybes", int | None)
MAYBE_BY_NAME = MapStateDescriptor("maybe-by-name", str | None, Optional[int])  # noqa: UP045
LATEST = ReducingStateDescriptor("latest", int | None, reduce_fn=lambda a, b: b)

Seen = tuple[int | None, int | None, list[int | None]]


class Optionals(KeyedProcessFunction[tuple[str | None, int | None], Seen]):
    def open(self, ctx: RuntimeContext) -> None:
        self.maybe = assert_type(ctx.get_state(MAYBE), ValueState[int | None])
        self.maybe_default = assert_type(ctx.get_state(MAYBE_DEFAULT), ValueState[int | None])
        self.maybes = assert_type(ctx.get_state(MAYBES), ListState[int | None])
        self.by_name = assert_type(ctx.get_state(MAYBE_BY_NAME), MapState[str | None, int | None])
        self.latest = assert_type(ctx.get_state(LATEST), ReducingState[int | None])

    def process_element(
        self, value: tuple[str | None, int | None], ctx: Context, out: Collector[Seen]
    ) -> None:
        name, n = value
        self.maybe.update(n)
        self.maybe_default.update(n)
        self.maybes.add(n)
        self.by_name.put(name, n)
        self.latest.add(n)
        out.collect((self.maybe.value(), self.maybe_default.value(), self.maybes.get()))

    def on_timer(self, timestamp: int, ctx: Any, out: Collector[Seen]) -> None:
        raise AssertionError("no timers")


def test_optional_types_type_check_and_keep_none_across_a_restore() -> None:
    h = KeyedFunctionHarness(Optionals(), key_selector=lambda v: "k")
    try:
        h.process_element(("a", 1))
        h.process_element((None, None))  # None clears a value state: it reads its default
        assert h.output() == [(1, 1, [1]), (None, -1, [1, None])]
        snapshot = h.snapshot()
    finally:
        h.close()
    restored = KeyedFunctionHarness(Optionals(), key_selector=lambda v: "k", restore_from=snapshot)
    try:
        assert restored.state(MAYBES, key="k").get() == [1, None]
        assert dict(restored.state(MAYBE_BY_NAME, key="k").items()) == {"a": 1, None: None}
        with pytest.raises(StateTypeError, match=re.escape("declared int | None")):
            restored.process_element(("b", "two"))  # type: ignore[arg-type]
    finally:
        restored.close()
