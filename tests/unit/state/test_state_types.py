"""State values keep their type across a checkpoint, and misfits are refused where stored.

Untyped states keep only what JSON gives back exactly; a declared type (value,
list element, map key and value) reads back as that type; pickle stays opt-in.
A checkpoint written by the old orjson codec restores, into the declared type.
"""

from __future__ import annotations

from dataclasses import field, make_dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from enum import IntEnum, StrEnum
from typing import Any, Optional

import orjson
import pytest

from aiostream_ckpt.errors import StateMigrationError
from aiostream_ckpt.state.codecs import StateTypeError
from aiostream_ckpt.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from tests.apps.typed_state import Color, Point

WHEN = datetime(2026, 11, 23, 13, 30, 5, 123000, tzinfo=UTC)
TYPED: list[tuple[Any, Any]] = [
    (datetime, WHEN),
    (datetime, datetime(2026, 1, 2, 3, 4, 5)),  # naive stays naive
    (date, date(2026, 2, 28)),
    (tuple[int, str], (3, "x")),
    (set[str], {"a", "b"}),
    (frozenset[int], frozenset({1, 2})),
    (Point, Point(1, 2.5, WHEN)),
    (Color, Color.BLUE),
    (dict[str, tuple[int, datetime]], {"a": (1, WHEN)}),
    (bytes, b"\x00\xff"),
    (int, 2**70),
]


def _restored(env: Any, handle: Any) -> Any:
    r = env.backend()
    r.restore(env.root, [handle])
    return r


def _id(value: object) -> str:
    """A test id that is the same in every process: a set's repr follows the hash seed,
    and pytest-xdist refuses workers that collected different ids."""
    if isinstance(value, set | frozenset):
        return f"{type(value).__name__}({sorted(value)!r})"[:30]
    return repr(value)[:30]


@pytest.mark.parametrize(("tp", "value"), TYPED, ids=[_id(v) for _, v in TYPED])
@pytest.mark.parametrize("ttl", [None, StateTtlConfig(3600)], ids=["plain", "ttl"])
def test_declared_type_reads_back_the_same_after_restore(env, tp, value, ttl) -> None:
    b = env.backend()
    d = ValueStateDescriptor("v", tp, ttl=ttl)
    b.create_state(d)
    b.key_context.key = "k"
    b.create_state(d).update(value)
    r = _restored(env, env.checkpoint(b, 1))
    r.key_context.key = "k"
    got = r.create_state(d).value()
    assert type(got) is type(value) and got == value


def test_list_map_and_reducing_element_types(env) -> None:
    b = env.backend()
    ls = ListStateDescriptor("l", tuple[str, datetime])
    ms = MapStateDescriptor("m", date, Point)
    rs = ReducingStateDescriptor("r", frozenset[int], reduce_fn=lambda a, c: a | c)
    b.key_context.key = "k"
    b.create_state(ls).add(("a", WHEN))
    b.create_state(ls).add_all([("b", WHEN)])
    b.create_state(ms).put(date(2026, 1, 1), Point(0, 1.0, WHEN))
    b.create_state(rs).add(frozenset({1}))
    b.create_state(rs).add(frozenset({2}))
    r = _restored(env, env.checkpoint(b, 1))
    r.key_context.key = "k"
    assert r.create_state(ls).get() == [("a", WHEN), ("b", WHEN)]
    assert list(r.create_state(ms).items()) == [(date(2026, 1, 1), Point(0, 1.0, WHEN))]
    assert r.create_state(rs).get() == frozenset({1, 2})


@pytest.mark.parametrize(
    ("value", "what"),
    [
        ({1, 2}, "type set"),
        ((1, 2), "type tuple"),
        (WHEN, "type datetime"),
        (Point(1, 2.0, WHEN), "type Point"),
        (Color.RED, "type Color"),
        ({"a": [1, (2, 3)]}, r"value\['a'\]\[1\] is a tuple"),
        ({1: "x"}, "dict key of type int"),
        (float("nan"), "not finite"),
        (b"raw", "type bytes"),
    ],
)
def test_untyped_state_refuses_at_update_what_would_change_type(env, value, what) -> None:
    b = env.backend()
    v = b.create_state(ValueStateDescriptor("last_seen"))
    b.key_context.key = "k"
    v.update(1)
    with pytest.raises(StateTypeError, match=rf"state 'last_seen'.*{what}") as err:
        v.update(value)
    assert "Declare the type" in str(err.value)
    assert v.value() == 1, "a refused value changes nothing"
    # the state goes on: the next checkpoint holds the last good value
    r = _restored(env, env.checkpoint(b, 1))
    r.key_context.key = "k"
    assert r.create_state(ValueStateDescriptor("last_seen")).value() == 1


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ({"at": WHEN}, "dict[str, datetime.datetime]"),
        ([(1, "a"), (2, "b")], "list[tuple[int, str]]"),
        ({"x": [date(2026, 1, 1), 3]}, "dict[str, list[datetime.date | int]]"),
        ({"a": {1, 2}}, "dict[str, set[int]]"),
        ((1, None), "tuple[int, NoneType]"),
        (WHEN, "datetime"),
    ],
    ids=_id,
)
def test_refusal_suggests_the_whole_type_and_that_type_keeps_the_value(env, value, hint) -> None:
    """Was ``ValueStateDescriptor('s', dict)`` for a dict of datetimes: it keeps none."""
    b = env.backend()
    b.key_context.key = "k"
    with pytest.raises(StateTypeError) as err:
        b.create_state(ValueStateDescriptor("s")).update(value)
    assert f"e.g. ValueStateDescriptor('s', {hint});" in str(err.value)
    # the hint, declared as written, keeps the value across a restore
    import datetime as datetime_module

    names = {"datetime": datetime if hint == "datetime" else datetime_module, "NoneType": None}
    declared = eval(hint, names)
    b2 = env.backend()
    b2.key_context.key = "k"
    b2.create_state(ValueStateDescriptor("s", declared)).update(value)
    r = _restored(env, env.checkpoint(b2, 1))
    r.key_context.key = "k"
    assert r.create_state(ValueStateDescriptor("s", declared)).value() == value


def test_refusal_points_at_the_users_line(env) -> None:
    """The error comes from update() itself, so its traceback ends in the caller's frame."""
    b = env.backend()
    v = b.create_state(ValueStateDescriptor("v"))
    b.key_context.key = "k"
    try:
        v.update({"a"})  # the user's line
    except StateTypeError as exc:
        tb = exc.__traceback__
        assert tb is not None and tb.tb_frame.f_code.co_name == (
            "test_refusal_points_at_the_users_line"
        )
    else:
        raise AssertionError("not refused")


def test_every_write_path_refuses(env) -> None:
    b = env.backend()
    b.key_context.key = "k"
    lst = b.create_state(ListStateDescriptor("l"))
    m = b.create_state(MapStateDescriptor("m"))
    red = b.create_state(ReducingStateDescriptor("r", reduce_fn=lambda a, c: c))
    ttl = b.create_state(ValueStateDescriptor("t", ttl=StateTtlConfig(60)))
    for call in (
        lambda: lst.add((1,)),
        lambda: lst.add_all([1, {2}]),
        lambda: lst.update([WHEN]),
        lambda: m.put("a", (1,)),
        lambda: m.put(WHEN, 1),
        lambda: red.add({1}),
        lambda: ttl.update((1,)),
    ):
        with pytest.raises(StateTypeError):
            call()
    assert lst.get() == [] and m.is_empty() and red.get() is None and ttl.value() is None
    m.put(("a", 1), [1])  # tuple keys are fine: they come back as tuples
    r = _restored(env, env.checkpoint(b, 1))
    r.key_context.key = "k"
    assert list(r.create_state(MapStateDescriptor("m")).items()) == [(("a", 1), [1])]


def test_typed_state_refuses_values_of_another_type(env) -> None:
    b = env.backend()
    b.key_context.key = "k"
    v = b.create_state(ValueStateDescriptor("last_seen", datetime))
    with pytest.raises(StateTypeError, match=r"'last_seen' is declared datetime.*type str"):
        v.update("2026-01-01T00:00:00")  # would read back as a datetime
    with pytest.raises(StateTypeError, match="type int"):
        v.update(5)
    lst = b.create_state(ListStateDescriptor("l", int))
    with pytest.raises(StateTypeError, match="declared int"):
        lst.add("x")
    m = b.create_state(MapStateDescriptor("m", int, str))
    with pytest.raises(StateTypeError, match="map key of type str"):
        m.put("1", "x")


def test_pickle_stays_opt_in_and_keeps_anything_picklable(env) -> None:
    b = env.backend()
    b.key_context.key = "k"
    d = ValueStateDescriptor("p", serializer="pickle")
    b.create_state(d).update({"s": {1, 2}, "t": (WHEN,)})
    with pytest.raises(StateTypeError, match="cannot pickle"):
        b.create_state(d).update(lambda: 1)
    r = _restored(env, env.checkpoint(b, 1))
    r.key_context.key = "k"
    assert r.create_state(d).value() == {"s": {1, 2}, "t": (WHEN,)}


def test_checkpoint_written_by_orjson_restores_into_the_declared_type(env, monkeypatch) -> None:
    """Old checkpoints (orjson bytes) restore; declaring a type then fixes what they hold."""
    import aiostream_ckpt.state.codecs as codecs

    old = {"ts": WHEN, "pair": (1, "a"), "color": Color.RED, "n": 7}
    b = env.backend()
    b.key_context.key = "k"
    # write as the previous version did: orjson bytes, tuples and datetimes included
    monkeypatch.setattr(codecs.UNTYPED, "dumps", orjson.dumps)
    monkeypatch.setattr(
        codecs.UntypedJsonCodec, "capture", lambda self, v, state: bytearray(orjson.dumps(v))
    )
    for name, value in old.items():
        b.create_state(ValueStateDescriptor(name)).update(value)
    handle = env.checkpoint(b, 1)
    monkeypatch.undo()
    r = _restored(env, handle)
    r.key_context.key = "k"
    assert r.create_state(ValueStateDescriptor("ts", datetime)).value() == WHEN
    assert r.create_state(ValueStateDescriptor("pair", tuple[int, str])).value() == (1, "a")
    assert r.create_state(ValueStateDescriptor("color", Color)).value() is Color.RED
    assert r.create_state(ValueStateDescriptor("n")).value() == 7


def test_unsupported_declared_type_fails_at_creation(env) -> None:
    b = env.backend()
    with pytest.raises(Exception, match="not supported"):
        b.create_state(ValueStateDescriptor("v", object()))


@pytest.mark.parametrize(
    ("tp", "value"),
    [
        (tuple[float, int], (1, 2)),
        (dict[str, float], {"a": 1}),
        (list[Decimal], [1]),
        (make_dataclass("Reading", [("n", int), ("avg", float)]), None),
    ],
    ids=["tuple", "dict", "decimal", "dataclass"],
)
def test_typed_state_refuses_a_nested_number_that_would_change_class(env, tp, value) -> None:
    """Equal is not the same: (1, 2) declared tuple[float, int] read back as (1.0, 2).

    Before, such a value was accepted, and an app that formats it printed 1 before a
    restore and 1.0 after (found by review; fails on the code before it).
    """
    value = tp(1, 2) if value is None else value
    b = env.backend()
    b.key_context.key = "k"
    v = b.create_state(ValueStateDescriptor("avg", tp))
    with pytest.raises(StateTypeError, match=r"state 'avg' is declared .*it would read back as"):
        v.update(value)
    assert v.value() is None


def test_typed_set_rebuilt_in_another_order_is_accepted(env) -> None:
    # a set that had removals iterates in another order than one built afresh from
    # its encoding: the bytes differ, the value does not
    s = set(range(0, 4000, 7)) - set(range(0, 4000, 14))
    b = env.backend()
    b.key_context.key = "k"
    d = ValueStateDescriptor("ids", set[int])
    b.create_state(d).update(s)
    r = _restored(env, env.checkpoint(b, 1))
    r.key_context.key = "k"
    assert r.create_state(d).value() == s


class Level(IntEnum):
    LOW = 1


Pt1 = make_dataclass("Pt", [("x", int)])
Pt2 = make_dataclass("Pt", [("x", int), ("label", str, field(default="-"))])


VS, LS, MS = ValueStateDescriptor, ListStateDescriptor, MapStateDescriptor


@pytest.mark.parametrize(
    ("before", "value", "after", "what"),
    [
        (VS("v", datetime), WHEN, VS("v"), "written as datetime, .* declares no type"),
        (VS("v", datetime), WHEN, VS("v", str), "written as datetime, .* declares str"),
        (VS("v", tuple[int, int]), (1, 2), VS("v", list[int]), "tuple.*list"),
        (VS("v", int), 1, VS("v", float), "int, .* declares float"),
        (MS("v", Level, int), (Level.LOW, 1), MS("v", int, int), "map keys written as Level"),
        (LS("v", date), date(2026, 1, 1), LS("v", str), "list elements written as date"),
    ],
    ids=["to-untyped", "to-str", "tuple-list", "int-float", "map-key", "list-element"],
)
def test_restore_refuses_a_changed_declared_type(env, before, value, after, what) -> None:
    """Stored bytes decode into what is declared now, often silently (a datetime as
    str, an IntEnum key as int): a restore under other types fails, naming the state
    and both types (Flink: an incompatible serializer). Fails on the code before it."""
    b = env.backend()
    b.key_context.key = "k"
    s = b.create_state(before)
    if before.kind == "map":
        s.put(*value)
    elif before.kind == "list":
        s.add(value)
    else:
        s.update(value)
    r = _restored(env, env.checkpoint(b, 1))
    with pytest.raises(StateMigrationError, match=rf"state 'v': .*{what}"):
        r.create_state(after)


def test_restore_takes_the_same_type_a_grown_dataclass_and_a_first_declaration(env) -> None:
    b = env.backend()
    b.key_context.key = "k"
    b.create_state(ValueStateDescriptor("p", Pt1)).update(Pt1(3))
    b.create_state(ValueStateDescriptor("u")).update("2026-01-01")
    b.create_state(ValueStateDescriptor("o", int | None)).update(4)
    r = _restored(env, env.checkpoint(b, 1))
    r.key_context.key = "k"
    assert r.create_state(ValueStateDescriptor("p", Pt2)).value() == Pt2(3, "-")
    assert r.create_state(ValueStateDescriptor("u", date)).value() == date(2026, 1, 1)
    assert r.create_state(ValueStateDescriptor("o", Optional[int])).value() == 4  # noqa: UP045


def test_rescale_merges_handles_where_one_instance_never_declared_the_type(env) -> None:
    """An instance that never created a state in its run keeps the types it restored
    (none, or none recorded by an older version): a rescale must take the other's
    declaration, not refuse the handles as differing (fails without the merge)."""
    day = "2026-01-01T00:00:00"
    keys = []

    def write(b: Any, key: str, i: int) -> None:
        keys.append(key)
        b.create_state(ValueStateDescriptor("seen")).update(day)  # untyped: the str

    def declare(b: Any, key: str, i: int) -> None:
        if i == 0:  # instance 1 sees no record of this state's in its run: never creates it
            b.create_state(ValueStateDescriptor("seen", datetime))

    first = env.checkpoint_instances(2, 1, write)
    second = env.checkpoint_instances(2, 2, declare, restore=first)
    assert second[1]["states"]["seen"]["types"] == [None, None]
    old_format = [dict(h, states={"seen": {**h["states"]["seen"]}}) for h in second]
    del old_format[1]["states"]["seen"]["types"]  # as a handle written before types were
    for handles in (second, old_format):
        r = env.backend()
        r.restore(env.root, handles)
        s = r.create_state(ValueStateDescriptor("seen", datetime))
        for key in keys:
            r.key_context.key = key
            assert s.value() == datetime(2026, 1, 1)


class Shade(StrEnum):
    DARK = "dark"


Swatch = make_dataclass("Swatch", [("shade", Shade), ("level", Level)])


@pytest.mark.parametrize(
    ("tp", "value"),
    [
        (list[Shade], ["dark"]),
        (dict[str, Level], {"a": 1}),
        (dict[Level, int], {1: 5}),
        (tuple[int, Shade], (1, "dark")),
        (set[Shade], {"dark"}),
        (Swatch, Swatch("dark", Level.LOW)),
        (list[Swatch], [Swatch(Shade.DARK, 1)]),
        (list[Shade | None], [None, "dark"]),
    ],
    ids=["list", "dict-value", "dict-key", "tuple", "set", "field", "nested-field", "optional"],
)
def test_typed_state_refuses_a_plain_str_or_int_where_a_str_or_int_enum_is_declared(
    env, tp, value
) -> None:
    """A plain "dark" in a list[Shade] (a StrEnum) encodes as Shade.DARK does and
    compares equal to it, but reads back as Shade.DARK after a restore: its type
    changed. Refused at the write, with where it is (fails on the code before it)."""
    b = env.backend()
    b.key_context.key = "k"
    v = b.create_state(ValueStateDescriptor("shades", tp))
    with pytest.raises(StateTypeError, match=r"state 'shades' is declared .*read back as"):
        v.update(value)
    assert v.value() is None
    lst = b.create_state(ListStateDescriptor("l", tp))
    with pytest.raises(StateTypeError, match=r"state 'l' is declared"):
        lst.add(value)
    m = b.create_state(MapStateDescriptor("m", str, tp))
    with pytest.raises(StateTypeError, match=r"state 'm' is declared"):
        m.put("a", value)


@pytest.mark.parametrize(
    ("tp", "value"),
    [
        (list[Shade], [Shade.DARK]),
        (dict[Level, Shade], {Level.LOW: Shade.DARK}),
        (set[Shade], {Shade.DARK}),
        (Swatch, Swatch(Shade.DARK, Level.LOW)),
        (list[Shade | None], [None, Shade.DARK]),
    ],
    ids=["list", "dict", "set", "fields", "optional"],
)
def test_declared_str_and_int_enums_in_containers_read_back_as_themselves(env, tp, value) -> None:
    b = env.backend()
    b.key_context.key = "k"
    d = ValueStateDescriptor("shades", tp)
    b.create_state(d).update(value)
    r = _restored(env, env.checkpoint(b, 1))
    r.key_context.key = "k"
    got = r.create_state(d).value()
    assert got == value and repr(got) == repr(value)


Tally = make_dataclass("Tally", [("n", int), ("avg", float)], eq=False)


def _tally_repr(t: Any) -> str:
    return f"{type(t).__name__}({t.n!r}, {t.avg!r})"


@pytest.mark.parametrize(
    ("tp", "value", "same"),
    [
        (Tally, Tally(1, 2.5), _tally_repr),
        (list[Tally], [Tally(1, 2.5)], lambda v: [_tally_repr(t) for t in v]),
        (Decimal, Decimal("NaN"), repr),
        (Decimal, Decimal("sNaN"), repr),
        (dict[str, Decimal], {"a": Decimal("-NaN")}, repr),
    ],
    ids=["eq-false", "eq-false-nested", "nan", "snan", "nested-nan"],
)
def test_values_equal_to_nothing_are_kept_when_they_read_back_the_same(
    env, tp, value, same
) -> None:
    """An eq=False dataclass equals only itself, Decimal('NaN') nothing: the check
    compared with ==, so they were refused though they read back the same (and
    sNaN's == raised InvalidOperation). Fails on the code before it."""
    b = env.backend()
    b.key_context.key = "k"
    d = ValueStateDescriptor("v", tp)
    b.create_state(d).update(value)
    r = _restored(env, env.checkpoint(b, 1))
    r.key_context.key = "k"
    assert same(r.create_state(d).value()) == same(value)


@pytest.mark.parametrize(
    ("tp", "value"),
    [
        (Tally, Tally(1, 2)),  # the int reads back as 2.0
        (list[Tally], [Tally(1, True)]),
        (dict[str, Decimal], {"a": Decimal("NaN"), "b": 1}),
        (list[list[int] | Decimal], [Decimal("NaN"), (1, 2)]),  # the tuple as a list
    ],
    ids=["eq-false-int", "eq-false-bool", "nan-and-int", "nan-and-tuple"],
)
def test_values_equal_to_nothing_are_still_refused_when_they_would_change(env, tp, value) -> None:
    b = env.backend()
    b.key_context.key = "k"
    v = b.create_state(ValueStateDescriptor("v", tp))
    with pytest.raises(StateTypeError, match=r"state 'v' is declared"):
        v.update(value)
    assert v.value() is None
