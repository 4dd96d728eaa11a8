"""Exact classes at a write: a check compiled from a declared type, run in C column by column.

Why: a ``str``/``int``/``float`` subclass instance (an enum member, a custom
``str``) encodes as its base value and compares equal to it, so a codec's
equality and byte checks pass; yet it reads back as its base class after a
restore (a ``Shade.DARK`` in a ``list[str]`` comes back ``"dark"``), or, the
reverse, a plain ``"dark"`` in a ``list[Shade]`` comes back ``Shade.DARK``.
Walking every value in Python to compare each item's class with its
read-back's costs several times the encoding; so the declared type is
compiled once into checks over *columns* (every item of a list, every value
of a dict, one field of every dataclass in a list), each a set of classes
taken in C. A check says True only when every class is one its position
reads back as; False sends the codec to the exact walk, which finds where.

Every container position is gated by its exact class too (as Flink's typed
serializers refuse a mismatched class): a ``set`` where ``frozenset`` is
declared (or back) compares equal and encodes the same, as do a NamedTuple
where ``tuple`` is, a ``bytearray`` where ``bytes`` is, a ``UUID`` or ``dict``
subclass. ``marshal`` tells exact built-ins from subclasses but takes a set
for a frozenset, so set-typed positions are compiled, not handed to it.
Scalars msgspec refuses to encode when subclassed (``datetime``, ``date``,
``time``, ``timedelta``, ``Decimal``, ``str``, ``int``, ``float``) need no gate.
"""

from __future__ import annotations

import marshal
import uuid
from collections.abc import Callable, Iterable
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any

import msgspec.inspect as mi

#: True: every item of the column has a class its declared position reads back as.
Check = Callable[[Iterable[Any]], bool]

#: JSON's scalar classes: what untyped JSON (and ``Any``) reads back, with lists and dicts.
JSON_SCALARS: frozenset[type] = frozenset({int, str, float, bool, type(None)})

_SCALARS: dict[type, frozenset[type]] = {
    mi.StrType: frozenset({str}),
    mi.IntType: frozenset({int}),
    mi.FloatType: frozenset({float}),
    mi.BoolType: frozenset({bool}),
    mi.NoneType: frozenset({type(None)}),
}
#: Scalars msgspec encodes for a subclass, or for another class equal to them.
_GATED_SCALARS: dict[type, type] = {
    mi.UUIDType: uuid.UUID,
    mi.BytesType: bytes,
    mi.ByteArrayType: bytearray,
    mi.MemoryViewType: memoryview,
}
#: The class msgspec decodes a container type into (a union member's gate).
_CONTAINERS: dict[type, type] = {
    mi.ListType: list,
    mi.SetType: set,
    mi.FrozenSetType: frozenset,
    mi.VarTupleType: tuple,
    mi.TupleType: tuple,
    mi.DictType: dict,
    mi.TypedDictType: dict,
}


#: What ``marshal`` checks exactly: not sets (it takes a set where a frozenset is declared).
_BUILTIN_CONTAINERS = (mi.UnionType, mi.ListType, mi.VarTupleType, mi.TupleType, mi.DictType)


class _Recursive(Exception):
    """A recursive type: its values are walked (see :func:`compile_check`)."""


def compile_check(tp: Any) -> Check | None:
    """Return the check of values of declared type ``tp``; None where none is needed.

    None: no position of ``tp`` can hold an item of another class that encodes
    and compares the same (only ``datetime``-like scalars, ``Decimal``, plain
    enums). A recursive type gets :data:`always_walk`. The value's own class
    is not checked: the codecs compare it with its read-back's.
    """
    try:
        check = _compile(mi.type_info(tp), set())
    except _Recursive:
        return always_walk
    return check.inner if isinstance(check, Gate) else check


def always_walk(items: Iterable[Any]) -> bool:
    """Say "walk" (False) always: the check of a recursive type, or a rare union."""
    return False


def _compile(t: mi.Type, active: set[int]) -> Check | None:
    if id(t) in active:
        raise _Recursive
    active.add(id(t))
    try:
        return _compile_one(t, active)
    finally:
        active.discard(id(t))


def _compile_one(t: mi.Type, active: set[int]) -> Check | None:
    if _builtin(t, set()):
        return None if t.__class__ in (mi.BoolType, mi.NoneType) else exact_builtins
    allowed = _allowed(t)
    if allowed is not None:
        return _exact(allowed)
    if isinstance(t, mi.UnionType):
        return _union(t, active)
    if isinstance(t, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
        inner = _compile(t.item_type, active)
        # built-in items: marshal takes the containers themselves (it looks inside)
        return Gate(_CONTAINERS[t.__class__], inner if inner is exact_builtins else _items(inner))
    if isinstance(t, mi.TupleType):
        return Gate(tuple, _columns([(i, _compile(x, active)) for i, x in enumerate(t.item_types)]))
    if isinstance(t, mi.DictType):
        keys, values = _compile(t.key_type, active), _compile(t.value_type, active)
        return Gate(dict, _dicts(keys, values))
    if isinstance(t, mi.TypedDictType):
        return Gate(dict, _sparse([(f.name, _compile(f.type, active)) for f in t.fields]))
    fields = getattr(t, "fields", None)
    if fields is None:
        return None
    parts = _columns([(f.name, _compile(f.type, active)) for f in fields])
    if isinstance(t, mi.NamedTupleType):  # equal to any tuple of its items
        return Gate(t.cls, parts)
    return parts  # a dataclass, attrs class, Struct: equal only to its own class


def _builtin(t: mi.Type, active: set[int]) -> bool:
    """Whether values of ``t`` are built of JSON scalars, lists, tuples and dicts only."""
    if t.__class__ in _SCALARS or isinstance(t, mi.AnyType | mi.LiteralType):
        return True
    if id(t) in active or not isinstance(t, _BUILTIN_CONTAINERS):
        return False  # a recursive type is compiled (and walked)
    active.add(id(t))
    parts = [getattr(t, a) for a in ("item_type", "key_type", "value_type") if hasattr(t, a)]
    parts += getattr(t, "item_types", None) or getattr(t, "types", None) or ()
    found = all(_builtin(p, active) for p in parts)
    active.discard(id(t))
    return found


def exact_builtins(items: Iterable[Any]) -> bool:
    """Whether every object in ``items`` is of an exact built-in class (no subclass anywhere).

    ``marshal`` writes only those (``CheckExact``), in C, nested or not:
    ~1.3 us per 100 items, half a set of their classes. Version 2 for ints
    (version 4 looks up each shared small int in its table of references),
    4 for the rest (its short ASCII strings).
    """
    items = items if items.__class__ is list else list(items)
    try:
        marshal.dumps(items, 2 if items and items[0].__class__ is int else 4)
    except ValueError:  # an object of another class (or nested deeper than msgspec takes)
        return False
    return True


def _allowed(t: mi.Type) -> frozenset[type] | None:
    """Return the classes a scalar position reads back as: ``str``, a str/int enum's, UUID."""
    if t.__class__ in _SCALARS:
        return _SCALARS[t.__class__]
    if t.__class__ in _GATED_SCALARS:
        return frozenset({_GATED_SCALARS[t.__class__]})
    if isinstance(t, mi.EnumType) and issubclass(t.cls, str | int):
        return frozenset({t.cls})
    if isinstance(t, mi.LiteralType):
        return frozenset(map(type, t.values))
    return None


def _exact(allowed: frozenset[type]) -> Check:
    if len(allowed) > 1:
        return lambda items: allowed.issuperset(map(type, items))
    (cls,) = allowed

    def check(items: Iterable[Any]) -> bool:
        # count() compares by identity first: half the time of a set's lookups
        classes = [*map(type, items)]
        return classes.count(cls) == len(classes)

    return check


class Gate:
    """The check of a position holding objects of exactly ``cls`` (then ``inner``'s).

    A class, not a closure: :func:`_columns` folds a gate of built-in items
    into its one ``marshal`` call and keeps only the class test apart.
    """

    __slots__ = ("cls", "inner")

    def __init__(self, cls: type, inner: Check | None) -> None:
        self.cls = cls
        self.inner = inner

    def __call__(self, items: Iterable[Any]) -> bool:
        items = items if items.__class__ is list else list(items)
        if [*map(type, items)].count(self.cls) != len(items):  # see _exact
            return False
        return self.inner is None or self.inner(items)


def _items(inner: Check | None) -> Check | None:
    if inner is None:
        return None
    return lambda items: inner(chain.from_iterable(items))


def _dicts(keys: Check | None, values: Check | None) -> Check | None:
    if keys is None and values is None:
        return None
    if keys is exact_builtins and isinstance(values, Gate) and values.inner is exact_builtins:
        return _dicts_of_sets(values.cls)

    def check(items: Iterable[Any]) -> bool:
        items = items if items.__class__ is list else list(items)
        return (keys is None or keys(chain.from_iterable(items))) and (
            values is None or values(chain.from_iterable(map(dict.values, items)))
        )

    return check


def _dicts_of_sets(cls: type) -> Check:
    """Check dicts of sets (or tuples ...) of ``cls`` whose keys and items are built-ins.

    One ``marshal`` call for the dicts, their keys and the sets' items, and the
    sets' class apart (a third of the cost of a pass per column).
    """

    def check(items: Iterable[Any]) -> bool:
        items = items if items.__class__ is list else list(items)
        if not exact_builtins(items):
            return False
        classes = [*map(type, chain.from_iterable(map(dict.values, items)))]
        return classes.count(cls) == len(classes)

    return check


def _columns(parts: list[tuple[Any, Check | None]]) -> Check | None:
    """Check one column per field (by name) or tuple position (by index) of every item.

    The built-in-only columns are taken by one getter and checked by one
    ``marshal`` call (a record's str, int and tuple fields at once); so are
    the items of a set-typed one, whose class is tested apart.
    """
    simple: list[Any] = []
    gated: list[tuple[Any, type]] = []
    others: list[tuple[Any, Check]] = []
    for key, c in parts:
        if c is exact_builtins:
            simple.append(key)
        elif isinstance(c, Gate) and c.inner is exact_builtins:
            simple.append(key)  # its items by marshal, its own class below
            gated.append((key, c.cls))
        elif c is not None:
            others.append((key, c))
    if not simple and not others:
        return None
    getter = _getter(simple) if simple else None
    classes = [(_getter([key]), cls) for key, cls in gated]
    cols = [(_getter([key]), check) for key, check in others]

    def check(items: Iterable[Any]) -> bool:
        items = items if items.__class__ is list else list(items)
        if getter is not None and not exact_builtins(list(map(getter, items))):
            return False
        for get, cls in classes:  # inlined Gate: a record's set field costs ~0.3 us, not 1
            if [*map(type, map(get, items))].count(cls) != len(items):
                return False
        return not cols or all(c(map(get, items)) for get, c in cols)

    return check


def _getter(keys: list[Any]) -> Callable[[Any], Any]:
    return itemgetter(*keys) if isinstance(keys[0], int) else attrgetter(*keys)


def _sparse(parts: list[tuple[str, Check | None]]) -> Check | None:
    """Check a TypedDict's fields, each where present."""
    cols = [(name, c) for name, c in parts if c is not None]
    if not cols:
        return None

    def check(items: Iterable[Any]) -> bool:
        items = items if items.__class__ is list else list(items)
        return all(c([d[name] for d in items if name in d]) for name, c in cols)

    return check


def _union(t: mi.UnionType, active: set[int]) -> Check | None:
    """Scalars by class; each other member by the class msgspec decodes it into."""
    allowed: set[type] = set()
    gates: dict[type, Check | None] = {}
    for m in t.types:
        scalar = _allowed(m)
        if scalar is not None:
            allowed |= scalar
            continue
        gate = getattr(m, "cls", None) or _CONTAINERS.get(m.__class__)
        if gate is None:
            return always_walk  # a datetime, Decimal ... beside: walked (rare)
        inner = _compile(m, active)
        gates[gate] = inner.inner if isinstance(inner, Gate) else inner
    if not gates:
        return _exact(frozenset(allowed))

    def check(items: Iterable[Any]) -> bool:
        by_gate: dict[type, list[Any]] = {}
        for x in items:
            cls = x.__class__
            if cls in allowed:
                continue
            if cls not in gates:
                return False
            by_gate.setdefault(cls, []).append(x)
        for gate, xs in by_gate.items():
            c = gates[gate]
            if c is not None and not c(xs):
                return False
        return True

    return check
