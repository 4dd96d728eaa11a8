"""A restore refuses a class whose stored fields would not read back; compatible evolution passes.

A checkpoint records, per state, the fields of each dataclass (attrs class,
Struct, NamedTuple, TypedDict) its declared types reach, as msgspec decodes
them. A class that keeps its name but changes a field's type (``y: float``
now ``y: str``) read its stored values into the new type, or failed only at
the first read of a key; now the restore fails with a StateMigrationError
naming the state, the class, the field and both types (Flink refuses an
incompatible serializer at restore). A field gained with a default, or
lost, still passes, and checkpoints without the record restore as before.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import field, make_dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple, Optional, TypedDict

import msgspec
import pytest

from aiostream_ckpt.errors import StateMigrationError
from aiostream_ckpt.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

VS, LS, MS = ValueStateDescriptor, ListStateDescriptor, MapStateDescriptor


def _pt(*fields: Any) -> Any:
    return make_dataclass("Pt", list(fields))


X, Y = ("x", int), ("y", float)
Pt = _pt(X, Y)
Inner = make_dataclass("Inner", [("n", int)])
InnerStr = make_dataclass("Inner", [("n", str)])
Outer = make_dataclass("Outer", [("inner", Inner)])
OuterStr = make_dataclass("Outer", [("inner", InnerStr)])


class Pair(NamedTuple):
    a: int
    b: float


class Swapped(NamedTuple):
    b: float
    a: int


Swapped.__qualname__ = Pair.__qualname__  # the same class name, fields reordered


def _write(env: Any, d: Any, value: Any) -> Any:
    b = env.backend()
    b.key_context.key = "k"
    s = b.create_state(d)
    if d.kind == "map":
        s.put("m", value)
    elif d.kind == "list":
        s.add(value)
    else:
        s.update(value)
    return env.checkpoint(b, 1)


def _restored(env: Any, *handles: Any) -> Any:
    r = env.backend()
    r.restore(env.root, list(handles))
    r.key_context.key = "k"
    return r


@pytest.mark.parametrize(
    ("before", "value", "after", "what"),
    [
        (VS("v", Pt), Pt(1, 2.5), VS("v", _pt(X, ("y", str))), "field 'y' .* float, .* str"),
        (VS("v", Pt), Pt(1, 2.5), VS("v", _pt(X, ("y", int))), "field 'y' .* float, .* int"),
        (LS("v", Outer), Outer(Inner(1)), LS("v", OuterStr), "Inner .*field 'n' .* int, .* str"),
        (MS("v", str, Pt), Pt(1, 2.5), MS("v", str, _pt(("x", str), Y)), "field 'x' .* int"),
        (VS("v", list[Pt]), [Pt(1, 2.5)], VS("v", list[_pt(X, ("y", list[int]))]), "list"),
        (VS("v", Pt), Pt(1, 2.5), VS("v", _pt(X, Y, ("z", int))), "without field 'z'"),
        (VS("v", Pair), Pair(1, 2.5), VS("v", Swapped), r"\['a', 'b'\] in this order"),
    ],
    ids=["float-str", "float-int", "nested", "map-value", "generic", "required", "order"],
)
def test_restore_refuses_a_class_whose_field_type_changed(env, before, value, after, what):
    """Fails on the code before (restored; the first read failed or read another type)."""
    r = _restored(env, _write(env, before, value))
    with pytest.raises(StateMigrationError, match=rf"state 'v': its checkpoint holds .*{what}"):
        r.create_state(after)


def test_restore_takes_a_class_that_gained_a_defaulted_field_or_lost_one(env) -> None:
    handle = _write(env, VS("v", Pt), Pt(1, 2.5))
    grown = _pt(X, Y, ("label", str, field(default="-")))
    assert _restored(env, handle).create_state(VS("v", grown)).value() == grown(1, 2.5, "-")
    shrunk = _pt(X)
    assert _restored(env, handle).create_state(VS("v", shrunk)).value() == shrunk(1)


def test_a_lost_field_stays_known_to_the_next_checkpoints(env) -> None:
    """Values not rewritten since a field was dropped still hold it: bringing it back
    under another type is refused; under its old type it reads back."""
    b = _restored(env, _write(env, VS("v", Pt), Pt(1, 2.5)))
    b.create_state(VS("v", _pt(X)))  # y dropped; the stored value is not rewritten
    handle = env.checkpoint(b, 2)
    with pytest.raises(StateMigrationError, match=r"field 'y' was written as float"):
        _restored(env, handle).create_state(VS("v", _pt(X, ("y", str, field(default="")))))
    back = _pt(X, ("y", float, field(default=0.0)))
    assert _restored(env, handle).create_state(VS("v", back)).value() == back(1, 2.5)


def test_checkpoints_without_the_class_record_restore_as_before(env) -> None:
    handle = _write(env, VS("v", Pt), Pt(1, 2.5))
    del handle["states"]["v"]["classes"]  # as written before the record was kept
    r = _restored(env, handle)
    s = r.create_state(VS("v", _pt(X, ("y", str))))  # not refused: nothing to compare
    with pytest.raises(StateMigrationError, match="does not fit"):
        s.value()  # ... and the first read fails, as it did


def test_rescale_merges_class_records_of_instances_that_saw_other_versions(env) -> None:
    """Instance 0 creates the state with a grown class, instance 1 never creates it
    (keeps the record it restored): a restore at p=1 takes both kinds of stored
    values, and still refuses a field whose type changed."""
    grown = _pt(X, Y, ("label", str, field(default="-")))
    keys = []

    def write(b: Any, key: str, i: int) -> None:
        keys.append(key)
        b.create_state(VS("v", Pt)).update(Pt(i, 2.5))

    def grow(b: Any, key: str, i: int) -> None:
        if i == 0:
            b.create_state(VS("v", grown)).update(grown(0, 2.5, "new"))

    second = env.checkpoint_instances(2, 2, grow, restore=env.checkpoint_instances(2, 1, write))
    r = env.backend()
    r.restore(env.root, second)
    s = r.create_state(VS("v", grown))
    got = []
    for key in keys:
        r.key_context.key = key
        got.append(s.value())
    assert got == [grown(0, 2.5, "new"), grown(1, 2.5, "-")]
    r = env.backend()
    r.restore(env.root, second)
    with pytest.raises(StateMigrationError, match=r"field 'label' was written as str"):
        r.create_state(VS("v", _pt(X, Y, ("label", int, field(default=0)))))


class Click(msgspec.Struct, tag=True):
    n: int


class View(msgspec.Struct, tag=True):
    url: str


class Buy(msgspec.Struct, tag=True):
    cents: int


Stamped, Ints, Letter = _pt(("at", datetime)), _pt(("xs", list[int])), _pt(("c", Literal["a"]))


@pytest.mark.parametrize(
    ("before", "value", "after"),
    [
        (VS("v", Pt), Pt(1, 2.5), VS("v", _pt(("x", Optional[int]), Y))),  # noqa: UP045 (both spellings)
        (VS("v", Pt), Pt(1, 2.5), VS("v", _pt(X, ("y", float | None, field(default=None))))),
        (VS("v", Stamped), Stamped(datetime(2026, 1, 2)), VS("v", _pt(("at", datetime | None)))),
        (VS("v", Ints), Ints([1]), VS("v", _pt(("xs", list[int | None])))),
        (MS("v", str, Letter), Letter("a"), MS("v", str, _pt(("c", Literal["a", "b"])))),
        (VS("v", int), 3, VS("v", int | None)),
        (LS("v", tuple[int, str]), (1, "a"), LS("v", tuple[int, str | None])),
        (VS("v", tuple[int, int]), (1, 2), VS("v", tuple[int, ...])),
        (LS("v", Click | View), Click(1), LS("v", Click | View | Buy)),
    ],
    ids=[
        *("optional", "or-none", "datetime", "list-item", "literal", "state-type"),
        *("tuple-item", "any-length", "tagged-union"),
    ],
)
def test_restore_takes_a_widened_type_and_keeps_it(env, before, value, after) -> None:
    """Fails on the code before (StateMigrationError: int now Union[None,int]). Stored
    values read back as written; the record keeps the wider type, so narrowing it
    back, once values of the wider type may be stored, is refused."""
    r = _restored(env, _write(env, before, value))
    s = r.create_state(after)
    got = s.get("m") if after.kind == "map" else s.get() if after.kind == "list" else s.value()
    want = [value] if after.kind == "list" else value
    assert repr(list(got) if after.kind == "list" else got) == repr(want)  # after's class
    with pytest.raises(StateMigrationError, match="its checkpoint holds"):
        _restored(env, env.checkpoint(r, 2)).create_state(before)


@pytest.mark.parametrize(
    ("one", "other", "value"),
    [(list[int], Sequence[int], [1]), (dict[str, int], Mapping[str, int], {"a": 1})],
)
def test_an_abstract_collection_restores_as_the_one_it_decodes_into(env, one, other, value):
    """Fails on the code before (StateMigrationError: list[int] now Sequence[int]):
    msgspec reads a Sequence as a list, a Mapping as a dict, either way round."""
    for before, after in ((one, other), (other, one)):
        r = _restored(env, _write(env, MS("v", str, before), value))
        assert r.create_state(MS("v", str, after)).get("m") == value


def test_rescale_merges_a_widened_type_with_an_instance_that_kept_the_old(env) -> None:
    """Instance 0 widens x to int | None, instance 1 never creates the state (keeps
    the record it restored): a restore at p=1 takes the wider type."""
    wide = _pt(("x", int | None), Y)

    def write(b: Any, key: str, i: int) -> None:
        b.create_state(VS("v", Pt)).update(Pt(i, 2.5))
        b.create_state(VS("n", int)).update(i)

    def widen(b: Any, key: str, i: int) -> None:
        if i == 0:
            b.create_state(VS("v", wide)).update(wide(None, 0.5))
            b.create_state(VS("n", int | None)).update(None)

    second = env.checkpoint_instances(2, 2, widen, restore=env.checkpoint_instances(2, 1, write))
    r = env.backend()
    r.restore(env.root, second)
    r.create_state(VS("v", wide))
    r.create_state(VS("n", int | None))
    r = env.backend()
    r.restore(env.root, second)
    with pytest.raises(StateMigrationError, match=r"field 'x' was written as Union\[None,int\]"):
        r.create_state(VS("v", Pt))


def _in(module: str, cls: Any) -> Any:
    cls.__module__ = module
    return cls


GeoPt, GpsPt = _in("geo", _pt(X)), _in("gps", _pt(("lat", float)))


def test_classes_of_one_name_in_two_modules_keep_a_record_each(env) -> None:
    """Fails on the code before: both Pt classes shared one record, the last walked,
    so reordering Outer's fields (compatible) refused the restore ("without field
    'lat'"), and only that one class was checked."""
    outer = make_dataclass("Outer", [("a", GeoPt), ("b", GpsPt)])
    handle = _write(env, VS("v", outer), outer(GeoPt(1), GpsPt(2.5)))
    swapped = make_dataclass("Outer", [("b", GpsPt), ("a", GeoPt)])
    assert _restored(env, handle).create_state(VS("v", swapped)).value() == swapped(
        GpsPt(2.5), GeoPt(1)
    )
    changed = make_dataclass("Outer", [("a", _in("geo", _pt(("x", str)))), ("b", GpsPt)])
    with pytest.raises(StateMigrationError, match=r"geo\.Pt values whose field 'x'"):
        _restored(env, handle).create_state(VS("v", changed))


class Note(msgspec.Struct, omit_defaults=True):
    n: int
    text: str = ""


class Sparse(TypedDict, total=False):
    n: int


class Dense(TypedDict):
    n: int


Dense.__qualname__ = "Sparse"  # the same class, total=True now


def test_restore_refuses_a_field_that_stored_values_may_lack_losing_its_default(env) -> None:
    """Fails on the code before (restored; the first read of a value written
    without the field failed, "Object missing required field"): an omit_defaults
    Struct or a total=False TypedDict writes no value for such a field."""
    note = make_dataclass("Note", [("n", int), ("text", str)])  # the default dropped
    note_struct = msgspec.defstruct("Note", [("n", int), ("text", str)])
    handle = _write(env, VS("v", Note), Note(1))
    for after in (note, note_struct):
        with pytest.raises(StateMigrationError, match="some without field 'text'"):
            _restored(env, handle).create_state(VS("v", after))
    assert _restored(env, handle).create_state(VS("v", Note)).value() == Note(1)
    handle = _write(env, VS("v", Sparse), Sparse())
    with pytest.raises(StateMigrationError, match="some without field 'n'"):
        _restored(env, handle).create_state(VS("v", Dense))


def _local(*fields: Any) -> Any:
    cls = _pt(*fields)
    cls.__qualname__ = f"build.<locals>.{cls.__qualname__}"
    return cls


def test_a_class_moved_out_of_the_function_that_defined_it_restores(env) -> None:
    """Fails on the code before ("written as build.<locals>.Pt, the job now declares
    Pt"): the qualified name held the function; its fields are still compared."""
    local = _local(X, Y)
    outer = make_dataclass("Outer", [("p", local)])
    handle = _write(env, LS("v", local), local(1, 2.5))
    assert _restored(env, handle).create_state(LS("v", Pt)).get() == [Pt(1, 2.5)]
    with pytest.raises(StateMigrationError, match="Pt values whose field 'y'"):
        _restored(env, handle).create_state(LS("v", _pt(X, ("y", str))))
    handle = _write(env, VS("o", outer), outer(local(1, 2.5)))
    back = make_dataclass("Outer", [("p", Pt)])  # a field's type moved out too
    assert _restored(env, handle).create_state(VS("o", back)).value() == back(Pt(1, 2.5))


@pytest.mark.parametrize(
    ("before", "value", "after"),
    [
        (VS("v", int), 3, VS("v")),
        (VS("v", dict[str, list[float | None]]), {"a": [1.5, None]}, VS("v")),
        (MS("v", str, int), 3, MS("v")),
        (LS("v", Literal["a", "b"] | None), "a", LS("v")),
    ],
    ids=["int", "nested", "map-key-and-value", "literal"],
)
def test_restore_takes_a_plain_json_type_dropped(env, before, value, after) -> None:
    """Fails on the code before ("written as int, the job now declares no type"):
    untyped JSON reads an int, a str, lists and str-keyed dicts of them as written.
    A datetime or tuple dropped stays refused (test_state_types.py)."""
    s = _restored(env, _write(env, before, value)).create_state(after)
    got = s.get("m") if after.kind == "map" else s.get() if after.kind == "list" else s.value()
    assert (list(got) if after.kind == "list" else got) == (
        [value] if after.kind == "list" else value
    )


def _rewrite(env: Any, handle: Any, d: Any, values: dict[str, Any], cid: int) -> Any:
    """Restore, declare ``d`` and write ``values`` by key (others keep their stored value)."""
    b = _restored(env, handle)
    s = b.create_state(d)
    for key, value in values.items():
        b.key_context.key = key
        s.update(value)
    return env.checkpoint(b, cid)


PtX, PtGrown = _pt(X), _pt(X, ("y", float, field(default=0.0)))


@pytest.mark.parametrize(
    ("first", "value", "then", "written"),
    [(Pt, Pt(1, 2.5), PtX, {"k2": PtX(2)}), (PtX, PtX(1), PtGrown, {"k2": PtGrown(2, 1.0)})],
    ids=["dropped", "gained-with-default"],
)
def test_restore_refuses_a_field_made_required_that_values_of_an_earlier_run_lack(
    env, first, value, then, written
) -> None:
    """Fails on the code before (restored; the first read of a value written without
    'y' failed: "Object missing required field `y`"). y dropped in run 2 (k2 written
    without it), or gained with a default in run 2 (k still without it): the record
    now says values may lack y, and the scan of the stored values finds one."""
    handle = _rewrite(env, _write(env, VS("v", first), value), VS("v", then), written, 2)
    with pytest.raises(StateMigrationError, match=r"Pt values some without field 'y'.*`y`"):
        _restored(env, handle).create_state(VS("v", Pt))
    assert _restored(env, handle).create_state(VS("v", then)).value() == then(1)


def test_a_field_made_required_restores_when_every_stored_value_holds_it(env) -> None:
    """No false refusal: y gained with a default and every key rewritten with it (or
    y always there): the scan finds it in each value, and the record says so since."""
    handle = _write(env, VS("v", PtX), PtX(1))
    handle = _rewrite(env, handle, VS("v", PtGrown), {"k": PtGrown(1, 0.5)}, 2)
    b = _restored(env, handle)
    assert b.create_state(VS("v", Pt)).value() == Pt(1, 0.5)
    handle = env.checkpoint(b, 3)
    assert handle["states"]["v"]["classes"]["Pt"].get("absent") is None
    assert _restored(env, handle).create_state(VS("v", Pt)).value() == Pt(1, 0.5)
    handle = _rewrite(env, _write(env, VS("v", PtGrown), PtGrown(1)), VS("v", PtGrown), {}, 2)
    assert _restored(env, handle).create_state(VS("v", Pt)).value() == Pt(1, 0.0)


def _struct(tag: Any = None, tag_field: Any = None, array_like: bool = False) -> Any:
    fields = [("n", int)]
    return msgspec.defstruct("Tap", fields, tag=tag, tag_field=tag_field, array_like=array_like)


def _also(name: str, tag_field: Any = None) -> Any:
    return msgspec.defstruct(name, [("u", str)], tag=True, tag_field=tag_field)


StrColor = enum.Enum("Color", {"RED": "red"})
IntColor = enum.Enum("Color", {"RED": 1})
Holder, IntHolder = _pt(("c", StrColor)), _pt(("c", IntColor))
Tap, Other, ArrayTap = _struct("tap"), _also("Other"), _struct(array_like=True)


@pytest.mark.parametrize(
    ("before", "value", "after", "what"),
    [
        (VS("v", StrColor), StrColor.RED, VS("v", IntColor), "Color values of str members"),
        (LS("v", Holder), Holder(StrColor.RED), LS("v", IntHolder), "int ones"),
        (MS("v", str, IntColor), IntColor.RED, MS("v", str, StrColor), "of int members"),
        (VS("v", Tap), Tap(1), VS("v", _struct("t")), "tagged type='tap', .* type='t'"),
        (LS("v", Tap | Other), Tap(1), LS("v", _struct("t") | Other), "type='t'"),
        (
            LS("v", Tap | Other),
            Tap(1),
            LS("v", _struct("tap", "k") | _also("Other", "k")),
            "tagged type='(Tap|Other)', .* k=",
        ),
        (VS("v", ArrayTap), ArrayTap(1), VS("v", _struct("t", array_like=True)), "no tag"),
    ],
    ids=["enum", "enum-field", "enum-map-key", "tag", "union-tag", "union-field", "array"],
)
def test_restore_refuses_an_enum_of_other_values_or_a_struct_of_another_tag(
    env, before, value, after, what
) -> None:
    """Fails on the code before (restored; the first read failed: "Expected `int`,
    got `str`", "Invalid value 'tap' - at `$.type`"): the record keeps an enum's
    kind of values and a Struct's tag."""
    r = _restored(env, _write(env, before, value))
    with pytest.raises(StateMigrationError, match=rf"state 'v': its checkpoint holds .*{what}"):
        r.create_state(after)


def test_restore_takes_a_struct_that_gained_or_lost_its_tag_or_an_enum_grown(env) -> None:
    """No false refusal: a lone object Struct's tag gained, lost or under another
    field reads its stored values; an enum may gain members."""
    for before, after in (
        (_struct(), _struct("tap")),
        (_struct("tap"), _struct()),
        (_struct("tap"), _struct("tap", "k")),
    ):
        r = _restored(env, _write(env, VS("v", before), before(1)))
        assert r.create_state(VS("v", after)).value() == after(1)
    grown = enum.Enum("Color", {"RED": "red", "BLUE": "blue"})
    assert (
        _restored(env, _write(env, VS("v", StrColor), StrColor.RED))
        .create_state(VS("v", grown))
        .value()
        is grown.RED
    )


@pytest.mark.parametrize("kind", ["value-ttl", "list", "map"])
def test_the_scan_reads_list_map_and_ttl_states(env, kind) -> None:
    """The scan of stored values decodes each kind's records (a list's whole list, each
    map entry, a TTL value after its timestamp): one lacking y refuses, none passes."""
    ttl = StateTtlConfig(3600.0) if kind == "value-ttl" else None

    def d(cls: Any) -> Any:
        if kind == "list":
            return LS("s", cls)
        return MS("s", str, cls) if kind == "map" else VS("s", cls, ttl=ttl)

    def write(b: Any, cls: Any, key: str, value: Any) -> None:
        b.key_context.key = key
        s = b.create_state(d(cls))
        s.put("m", value) if kind == "map" else s.add(value) if kind == "list" else s.update(value)

    b = env.backend()
    write(b, Pt, "k", Pt(1, 2.5))
    b = _restored(env, env.checkpoint(b, 1))
    b.create_state(d(PtX))  # y dropped, nothing written: the record says values may lack y
    handle = env.checkpoint(b, 2)
    assert handle["states"]["s"]["classes"]["Pt"]["absent"] == ["y"]
    r = _restored(env, handle)
    r.create_state(d(Pt))  # the scan finds y in the one stored value
    assert "absent" not in env.checkpoint(r, 3)["states"]["s"]["classes"]["Pt"]
    b = _restored(env, handle)
    write(b, PtX, "k3", PtX(3))
    with pytest.raises(StateMigrationError, match="Pt values some without field 'y'"):
        _restored(env, env.checkpoint(b, 4)).create_state(d(Pt))


RedBlue = enum.Enum("Color", {"RED": "red", "BLUE": "blue"})
Paint = _pt(("c", RedBlue))


@pytest.mark.parametrize(
    ("d", "value", "after"),
    [
        (VS("v", RedBlue), RedBlue.BLUE, VS("v", StrColor)),
        (LS("v", Paint), Paint(RedBlue.BLUE), LS("v", _pt(("c", StrColor)))),
    ],
    ids=["value", "field"],
)
def test_restore_refuses_an_enum_that_lost_a_member_a_stored_value_holds(env, d, value, after):
    """Fails on the code before (restored; the first read failed: "Invalid enum value
    'blue'"). The record keeps an enum's members; where the job's enum lacks some,
    the stored values are scanned: one holds 'blue', so the restore is refused."""
    handle = _write(env, d, value)
    with pytest.raises(StateMigrationError, match=r"Color values some of members \['blue'\]"):
        _restored(env, handle).create_state(after)


def test_an_enum_that_lost_a_member_no_stored_value_holds_restores(env) -> None:
    """No false refusal: only RED is stored; the scan finds no BLUE, and the next
    checkpoint's record no longer lists it (no scan at the next restore)."""
    r = _restored(env, _write(env, VS("v", RedBlue), RedBlue.RED))
    assert r.create_state(VS("v", StrColor)).value() is StrColor.RED
    handle = env.checkpoint(r, 2)
    assert handle["states"]["v"]["classes"]["Color"]["members"] == ["red"]


@pytest.mark.parametrize("kind", ["value", "map", "enum"])
def test_an_expired_value_neither_refuses_the_restore_nor_fails_a_read(env, kind) -> None:
    """Fails on the code before (the restore refused: the scan decoded a TTL-expired
    value, which no read returns). The scan skips expired values, and a read never
    decodes one, so one that lacks a field since made required, or holds a removed
    enum member, is simply gone, at this restore and at later ones (unscanned)."""
    ttl = StateTtlConfig(60.0)
    old, new, stale = (RedBlue, StrColor, RedBlue.BLUE) if kind == "enum" else (PtX, Pt, PtX(3))

    def d(cls: Any) -> Any:
        return MS("s", str, cls, ttl=ttl) if kind == "map" else VS("s", cls, ttl=ttl)

    def state(b: Any, cls: Any, key: str) -> Any:
        b.key_context.key = key
        return b.create_state(d(cls))

    def read(s: Any) -> Any:
        return s.get("m") if kind == "map" else s.value()

    b = env.backend()
    first = RedBlue.RED if kind == "enum" else Pt(1, 2.5)
    s = state(b, old if kind == "enum" else Pt, "k")
    s.put("m", first) if kind == "map" else s.update(first)
    b = _restored(env, env.checkpoint(b, 1))
    s = state(b, old if kind == "enum" else PtX, "stale")  # the record: values may lack y
    s.put("m", stale) if kind == "map" else s.update(stale)
    handle = env.checkpoint(b, 2)
    env.clock.advance(120.0)  # "stale" expires, "k" was written before: both expired
    b = _restored(env, handle)
    s = state(b, new, "fresh")
    fresh = StrColor.RED if kind == "enum" else Pt(4, 5.0)
    s.put("m", fresh) if kind == "map" else s.update(fresh)
    b.key_context.key = "k"
    assert read(s) is None
    later = _restored(env, env.checkpoint(b, 3))  # its record no longer asks for a scan
    s = state(later, new, "stale")
    assert read(s) is None
    later.key_context.key = "fresh"
    assert read(s) == fresh


@pytest.mark.parametrize("value_type", [int, None], ids=["int values", "untyped values"])
@pytest.mark.parametrize("stored", [RedBlue.BLUE, RedBlue.RED])
def test_a_map_key_enum_that_lost_a_member_is_scanned_too(env, stored, value_type) -> None:
    """Fails on the code before: BLUE restored, then the first items() raised msgspec's
    ValidationError "Invalid enum value 'blue'" (the scan decoded the map's values
    only, and cleared the enum the keys share); RED with untyped values was refused
    (the values were decoded as None: "Expected `null`, got `int`"). Now the map
    keys are decoded too, untyped values not: a stored BLUE key refuses; with only
    RED stored it restores."""
    b = env.backend()
    b.key_context.key = "k"
    b.create_state(MS("m", RedBlue, value_type)).put(stored, 1)
    r = _restored(env, env.checkpoint(b, 1))
    if stored is RedBlue.BLUE:
        with pytest.raises(StateMigrationError, match=r"members \['blue'\].*a map key"):
            r.create_state(MS("m", StrColor, value_type))
    else:
        m = r.create_state(MS("m", StrColor, value_type))
        assert list(m.items()) == [(StrColor.RED, 1)]
