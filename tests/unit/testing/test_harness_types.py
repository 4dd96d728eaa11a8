"""An app author's harness test type-checks: mypy checks this file (``files`` in pyproject).

``h.state(descriptor, key=...)`` is typed by the descriptor as ``ctx.get_state``
is (``assert_type`` fails mypy on an ``Any``), and ``key_type=`` lets the
harness run a function keyed by an enum, a date or a tuple of them, as
``key_by(selector, key_type=...)`` does in a job: those keys come back as
themselves in ``ctx.current_key`` and after a restore.
"""

from __future__ import annotations

import enum
from datetime import date
from typing import Any, assert_type

import pytest

from aiostream_ckpt.api import ListState, MapState, ReducingState, ValueState
from aiostream_ckpt.api.functions import (
    Collector,
    Context,
    KeyedProcessFunction,
    OnTimerContext,
    RuntimeContext,
)
from aiostream_ckpt.state.codecs import StateTypeError
from aiostream_ckpt.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from aiostream_ckpt.testing import KeyedFunctionHarness


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


Click = tuple[Color, date, int]  # (color, day, event time in ms)
Key = tuple[Color, date]

COUNT = ValueStateDescriptor("count", int, default=0)
LAST_TS = ValueStateDescriptor("last-ts", int | None)  # None until the key's first record
SEEN = ListStateDescriptor("seen", int)
PER_DAY = MapStateDescriptor("per-day", date, int)
MAX_TS = ReducingStateDescriptor("max-ts", int, reduce_fn=max)


class CountPerColorAndDay(KeyedProcessFunction[Click, tuple[Key, int]]):
    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(COUNT)
        self.last_ts = ctx.get_state(LAST_TS)
        self.seen = ctx.get_state(SEEN)
        self.per_day = ctx.get_state(PER_DAY)
        self.max_ts = ctx.get_state(MAX_TS)

    def process_element(self, value: Click, ctx: Context, out: Collector[tuple[Key, int]]) -> None:
        _, day, ts = value
        if self.last_ts.value() is None:
            ctx.timer_service().register_event_time_timer(ts + 1_000)
        self.count.update(self.count.value() + 1)
        self.last_ts.update(ts)
        self.seen.add(ts)
        self.per_day.put(day, self.per_day.get(day, 0) + 1)
        self.max_ts.add(ts)

    def on_timer(
        self, timestamp: int, ctx: OnTimerContext, out: Collector[tuple[Key, int]]
    ) -> None:
        out.collect((ctx.current_key, self.count.value()))


def harness(**kw: Any) -> KeyedFunctionHarness[Click, tuple[Key, int]]:
    return KeyedFunctionHarness(
        CountPerColorAndDay(), key_selector=lambda c: (c[0], c[1]), key_type=Key, **kw
    )


def test_state_is_typed_by_its_descriptor_and_keys_keep_their_declared_type() -> None:
    day = date(2026, 11, 26)
    h = harness()
    try:
        for ts in (100, 300):
            h.process_element((Color.RED, day, ts))
        h.process_element((Color.BLUE, day, 200))
        key = (Color.RED, day)
        count = assert_type(h.state(COUNT, key=key), ValueState[int])
        last_ts = assert_type(h.state(LAST_TS, key=key), ValueState[int | None])
        seen = assert_type(h.state(SEEN, key=key), ListState[int])
        per_day = assert_type(h.state(PER_DAY, key=key), MapState[date, int])
        max_ts = assert_type(h.state(MAX_TS, key=key), ReducingState[int])
        assert (count.value(), last_ts.value(), max_ts.get()) == (2, 300, 300)
        assert seen.get() == [100, 300]
        assert list(per_day.items()) == [(day, 2)]  # an iterator, read under this key
        assert h.state(LAST_TS, key=(Color.BLUE, date(2026, 1, 1))).value() is None

        snapshot = h.snapshot()
        h.process_watermark(1_100)
        assert h.output() == [((Color.RED, day), 2)]  # the key as itself, not ["red", "2026-11-26"]
    finally:
        h.close()
    restored = harness(restore_from=snapshot)
    try:
        assert sorted(restored.keys("count"), key=str) == [(Color.BLUE, day), (Color.RED, day)]
        restored.process_watermark(1_200)
        assert restored.output() == [((Color.RED, day), 2), ((Color.BLUE, day), 1)]
    finally:
        restored.close()


def test_without_key_type_such_a_key_is_refused_at_its_first_state_access() -> None:
    h = KeyedFunctionHarness(CountPerColorAndDay(), key_selector=lambda c: (c[0], c[1]))
    try:
        with pytest.raises(StateTypeError, match="key_type="):
            h.process_element((Color.RED, date(2026, 11, 26), 100))
    finally:
        h.close()
