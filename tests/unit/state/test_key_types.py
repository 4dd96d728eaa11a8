"""Stream keys of declared types (``key_by(selector, key_type=...)``): hashed and stored
as their JSON bytes, read back as themselves; undeclared non-JSON keys are refused."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, date, datetime
from enum import StrEnum
from typing import Any

import pytest

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.api.functions import Collector, Context, RuntimeContext
from aiostream_ckpt.connectors.collection import CollectionSource
from aiostream_ckpt.errors import JobGraphError, StateError
from aiostream_ckpt.jobspec.broadcast import KeyedBroadcastProcessFunction
from aiostream_ckpt.jobspec.co_functions import KeyedCoProcessFunction
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.state.codecs import StateTypeError
from aiostream_ckpt.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from aiostream_ckpt.state.keygroups import key_group_for, serialize_key
from aiostream_ckpt.time import ProcessJoinFunction, WatermarkStrategy
from tests.apps.typed_keys import Color


@dataclass(frozen=True)
class Account:
    bank: str
    number: int


KEYS: list[tuple[Any, Any]] = [
    (Color, Color.GREEN),
    (date, date(2024, 2, 29)),
    (datetime, datetime(2024, 2, 29, 12, 30, 1, 5, tzinfo=UTC)),
    (tuple[Color, date], (Color.RED, date(2024, 3, 1))),
    (Account, Account("x", 7)),
]


@pytest.mark.parametrize(("tp", "key"), KEYS, ids=[t.__name__ for t, _ in KEYS])
def test_declared_key_reads_back_with_its_type_after_restore(env, tp, key) -> None:
    b = env.backend(key_type=tp)
    d = ValueStateDescriptor("n", int)
    b.key_context.key = key
    b.create_state(d).update(5)
    r = env.backend(key_type=tp)
    r.restore(env.root, [env.checkpoint(b, 1)])
    [got] = list(r.keys("n"))
    assert type(got) is type(key) and got == key
    r.key_context.key = got
    assert r.create_state(d).value() == 5


def test_key_groups_of_declared_keys_are_the_same_in_every_process() -> None:
    # the key group is the crc32 of the key's JSON bytes: no per-process hash seed
    keys = [Color.BLUE, date(2024, 2, 29), (Color.RED, date(2024, 3, 1))]
    here = [key_group_for(serialize_key(k), 128) for k in keys]
    code = (
        "from datetime import date; from tests.apps.typed_keys import Color; "
        "from aiostream_ckpt.state.keygroups import key_group_for, serialize_key; "
        "print([key_group_for(serialize_key(k), 128) for k in "
        "[Color.BLUE, date(2024, 2, 29), (Color.RED, date(2024, 3, 1))]])"
    )
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert there.strip() == str(here)


def test_undeclared_enum_key_is_refused_naming_its_type_and_key_type(env) -> None:
    b = env.backend()
    s = b.create_state(ValueStateDescriptor("n", int))
    for key, name in ((Color.RED, "Color"), (date(2024, 2, 29), "date")):
        b.key_context.key = key
        with pytest.raises(StateTypeError) as err:
            s.value()
        msg = str(err.value)
        assert f"key of type {name}" in msg and f"key_type={name}" in msg


def test_a_key_of_another_type_than_declared_is_refused(env) -> None:
    b = env.backend(key_type=Color)
    s = b.create_state(ValueStateDescriptor("n", int))
    b.key_context.key = "red"  # the selector forgot Color(...)
    with pytest.raises(StateTypeError, match=r"key_type=Color.*'red' of type str"):
        s.value()


class Shade(StrEnum):
    DARK = "dark"


WRITES_WITHOUT_A_READ: list[tuple[str, Any, Any]] = [
    ("update", ValueStateDescriptor("v"), lambda s: s.update(1)),
    ("update-list", ValueStateDescriptor("v"), lambda s: s.update([1])),
    ("typed-update", ValueStateDescriptor("v", int), lambda s: s.update(1)),
    ("ttl-update", ValueStateDescriptor("v", ttl=StateTtlConfig(60)), lambda s: s.update(1)),
    ("clear", ValueStateDescriptor("v"), lambda s: s.clear()),
    ("list-update", ListStateDescriptor("l", int), lambda s: s.update([1])),
    ("map-clear", MapStateDescriptor("m", int, int), lambda s: s.clear()),
    ("map-put-unread", MapStateDescriptor("m", int, int), lambda s: s.put_unread(1, 1)),
]


#: (declared key_type, a key that would read back as another type, why it is refused)
CHANGING_KEYS = pytest.mark.parametrize(
    ("key_type", "key", "why"),
    [
        (None, Shade.DARK, "key of type Shade"),
        (str, Shade.DARK, r"key_type=str.*Shade \(a str subclass\)"),
        (Shade, "dark", r"key_type=Shade.*'dark' of type str"),
    ],
    ids=["enum-untyped", "enum-for-str", "str-for-enum"],
)


@pytest.mark.parametrize(
    ("d", "write"),
    [w[1:] for w in WRITES_WITHOUT_A_READ],
    ids=[w[0] for w in WRITES_WITHOUT_A_READ],
)
@CHANGING_KEYS
def test_a_write_without_a_read_refuses_a_key_that_would_change_type(
    env, d, write, key_type, key, why
) -> None:
    """Fails on the code before (every case): a write checked no key, only a read's
    cache miss did; the key read back as str (or as the enum) after a restore."""
    b = env.backend(key_type=key_type)
    s = b.create_state(d)
    b.key_context.key = key
    with pytest.raises(StateTypeError, match=why):
        write(s)
    b.key_context.key = "dark" if key_type is not Shade else Shade.DARK
    write(s)  # the right key still goes


def test_a_key_type_that_is_no_type_fails_at_key_by() -> None:
    env = StreamEnvironment("doc")
    with pytest.raises(StateError, match="key_type 'Color' is not supported"):
        env.from_collection([1]).key_by(lambda x: x, key_type="Color")


def test_declared_keys_run_through_a_job() -> None:
    env = StreamEnvironment("doc")
    days = [date(2024, 2, 28), date(2024, 2, 29), date(2024, 2, 28)]
    s = env.from_collection(days).key_by(lambda d: d, key_type=date)
    out = s.reduce(lambda a, b: b, uid="last", value_type=date)
    assert env.execute_and_collect(out) == days


# -- the two-input keyed operators take key_type too ------------------------------------

WMS = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(lambda e: e[1])


class CountPerKey(KeyedCoProcessFunction[Any, Any, Any]):
    """Counts both inputs' records per key in keyed state; says the key's type."""

    def open(self, ctx: RuntimeContext) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def _count(self, side: str, ctx: Context, out: Collector[Any]) -> None:
        self.n.update(self.n.value() + 1)
        out.collect((side, ctx.current_key, self.n.value()))

    def process_element1(self, value: Any, ctx: Context, out: Collector[Any]) -> None:
        self._count("a", ctx, out)

    def process_element2(self, value: Any, ctx: Context, out: Collector[Any]) -> None:
        self._count("b", ctx, out)


def test_connect_key_by_takes_the_key_type() -> None:
    env = StreamEnvironment("doc", config=JobConfig(parallelism=2))
    a = env.from_collection(["red", "green"], uid="a")
    b = env.from_collection([("red", 1)], uid="b")
    out = a.connect(b).key_by(Color, lambda r: Color(r[0]), key_type=Color).process(CountPerKey())
    got = env.execute_and_collect(out)
    assert sorted((side, key.name) for side, key, _ in got) == [
        ("a", "GREEN"),
        ("a", "RED"),
        ("b", "RED"),
    ]
    assert all(type(key) is Color for _, key, _ in got)
    assert sorted(n for _, key, n in got if key is Color.RED) == [1, 2]  # one state per key
    with pytest.raises(StateError, match="key_type 'Color' is not supported"):
        a.connect(b).key_by(str, str, key_type="Color")


class KeyedEcho(KeyedBroadcastProcessFunction[Any, Any, Any]):
    def open(self, ctx: RuntimeContext) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def process_element(self, value: Any, ctx: Context, out: Collector[Any]) -> None:
        self.n.update(self.n.value() + 1)
        out.collect((ctx.current_key, self.n.value()))

    def process_broadcast_element(self, value: Any, ctx: Context, out: Collector[Any]) -> None:
        pass


def test_a_keyed_stream_connected_to_a_broadcast_keeps_its_key_type() -> None:
    env = StreamEnvironment("doc")
    rules = env.from_collection([("limit", 1)], uid="rules").broadcast(
        MapStateDescriptor("rules", str, int)
    )
    keyed = env.from_collection(["red", "red"], uid="a").key_by(Color, key_type=Color)
    out = keyed.connect(rules).process(KeyedEcho())
    assert env.execute_and_collect(out) == [(Color.RED, 1), (Color.RED, 2)]


class JoinedKey(ProcessJoinFunction[Any, Any, Any]):
    def process_element(self, left: Any, right: Any, ctx: Any, out: Collector[Any]) -> None:
        out.collect((ctx.current_key, left[1], right[1]))


def test_interval_join_keeps_the_inputs_key_type() -> None:
    env = StreamEnvironment("doc", config=JobConfig(batch_size=1))
    a = env.from_source(CollectionSource([("red", 10)]), uid="a", watermark_strategy=WMS)
    b = env.from_source(CollectionSource([("red", 12)]), uid="b", watermark_strategy=WMS)
    left = a.key_by(lambda r: Color(r[0]), key_type=Color)
    joined = left.interval_join(b.key_by(lambda r: Color(r[0]))).between(-5, 5)
    out = joined.process(JoinedKey(), left_type=tuple[str, int], right_type=tuple[str, int])
    assert env.execute_and_collect(out) == [(Color.RED, 10, 12)]
    other = b.key_by(lambda r: r[1], key_type=int)
    with pytest.raises(JobGraphError, match="different key types"):
        left.interval_join(other).between(-5, 5).process(JoinedKey())
