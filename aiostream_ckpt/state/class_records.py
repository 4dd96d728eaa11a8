"""What a checkpoint records of the classes a state's declared types reach.

Why: at a restore the old job's classes are gone; its checkpoint has only
what it recorded. :mod:`~aiostream_ckpt.state.evolution` compares these
records with the job's classes (and merges them across runs and instances);
:mod:`~aiostream_ckpt.state.key_evolution` does the same for key types.
Each dataclass, attrs class, ``msgspec.Struct``, ``NamedTuple``,
``TypedDict`` and enum a type reaches is named by :func:`type_key` and
described as msgspec decodes it.
"""

from __future__ import annotations

import functools
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec.inspect as mi

#: One class of a ``classes`` record: {"layout": "object"|"array"|"enum", "fields": [[name,
#: type]]}, and where they apply "absent", "values", "members", "tags" (:func:`stored_record`).
ClassRecord = dict[str, Any]


def type_key(tp: Any) -> str | None:
    """Name a declared type the same way in every process and run; None: untyped.

    Classes by qualified name without their module (an app's module name may
    differ between runs), generics by origin and arguments, unions order-free
    (``int | None`` is ``Optional[int]``), ``Annotated`` by its type.

    >>> type_key(dict[str, tuple[int, ...]]), type_key(int | None) == type_key(None | int)
    ('dict[str,tuple[int,...]]', True)
    """
    if tp is None:
        return None
    origin = get_origin(tp)
    if origin is None:
        if tp is Ellipsis:
            return "..."
        name = getattr(tp, "__qualname__", None)
        return name if isinstance(name, str) else repr(tp)
    args = get_args(tp)
    if origin is Annotated:
        return type_key(args[0])
    if origin is Literal:
        return f"Literal[{','.join(sorted(repr(a) for a in args))}]"
    parts = [type_key(a) or "None" for a in args]
    if origin is Union or origin is UnionType:
        return f"Union[{','.join(sorted(parts))}]"
    return f"{type_key(origin)}[{','.join(parts)}]"


def reached_classes(
    types: tuple[Any, Any],
) -> tuple[dict[str, ClassRecord], dict[str, ClassRecord]]:
    """Return the classes ``types`` reach: (fields as [name, type, required], stored).

    Cached by type: msgspec's view of a dataclass takes ~0.2 ms, and
    ``create_state`` describes a state on every call, also for one that exists.
    """
    try:
        return _cached_classes(types)
    except TypeError:  # an unhashable type (Annotated metadata)
        return _find_classes(types)


def class_records(tp: Any) -> dict[str, ClassRecord]:
    """Return the ``classes`` record (as a checkpoint keeps it) of the classes ``tp`` reaches."""
    return reached_classes((tp, None))[1]


def _find_classes(types: tuple[Any, Any]) -> tuple[dict[str, ClassRecord], dict[str, ClassRecord]]:
    try:
        todo = [mi.type_info(tp) for tp in types if tp is not None]
    except TypeError:  # not a type msgspec supports: the state's codec says so, naming it
        return NO_CLASSES
    reached: list[mi.Type] = []
    seen: set[int] = set()
    while todo:
        t = todo.pop()
        if id(t) in seen:  # recursive types are cycles
            continue
        seen.add(id(t))
        reached.append(t)
        todo.extend(_parts(t))
        todo.extend(f.type for f in getattr(t, "fields", None) or ())
    names = _class_names([c for t in reached if (c := getattr(t, "cls", None)) is not None])
    in_unions = {  # a union of Structs tells them apart by their tags
        id(m)
        for t in reached
        if isinstance(t, mi.UnionType) and sum(isinstance(m, mi.StructType) for m in t.types) > 1
        for m in t.types
    }
    found: dict[str, ClassRecord] = {}
    for t in reached:
        fields = getattr(t, "fields", None)
        cls = getattr(t, "cls", None)
        name = names.get(id(cls)) or type_key(cls) or "?"
        if isinstance(t, mi.EnumType):  # members are all str or all int (msgspec)
            members = sorted({m.value for m in t.cls})
            kind = "str" if any(isinstance(m, str) for m in members) else "int"
            found[name] = {"layout": "enum", "fields": [], "values": kind, "members": members}
        elif fields is not None:
            array = isinstance(t, mi.NamedTupleType) or getattr(t, "array_like", False)
            found[name] = {
                "layout": "array" if array else "object",
                "fields": [[f.encode_name, _info_key(f.type), f.required] for f in fields],
                "absent": _absent(t),
                "union": id(t) in in_unions,
            }
            if isinstance(t, mi.StructType) and t.tag is not None:
                found[name]["tags"] = [[t.tag_field, t.tag]]
    stored = {k: stored_record(r) for k, r in found.items()}
    return found, stored


def _absent(t: mi.Type) -> list[str]:
    """Return the fields stored values may lack.

    A ``total=False`` TypedDict's, or a Struct's defaulted ones under
    ``omit_defaults``; a dataclass writes all its fields.
    """
    config = getattr(getattr(t, "cls", None), "__struct_config__", None)
    if isinstance(t, mi.TypedDictType) or getattr(config, "omit_defaults", False):
        return sorted(f.encode_name for f in getattr(t, "fields", ()) if not f.required)
    return []


def stored_record(rec: ClassRecord) -> ClassRecord:
    """Return a class record as a checkpoint keeps it: [name, type] fields; others if any.

    "values": an enum's members' kind (``str``, ``int``), "members" their
    values (stored values may hold any of them); "tags": the
    ``[tag field, tag]`` a tagged Struct's stored values carry (``[None,
    None]``: untagged ones, where a class gained or lost its tag).
    """
    stored = {"layout": rec["layout"], "fields": [f[:2] for f in rec["fields"]]}
    for part in ("absent", "values", "members", "tags"):
        if rec.get(part):
            stored[part] = rec[part]
    return stored


def _class_names(classes: list[Any]) -> dict[int, str]:
    """Key the records of classes that share a :func:`type_key` by module too (by ``id``).

    Two ``Point`` classes of two modules in one state shared one record, the
    last one walked: reordering the fields that reach them (a compatible
    change) swapped it and refused the restore. Field types keep the short
    name, so that a module renamed between runs (``__main__``) refuses
    nothing: such a record is then new, unchecked.
    """
    by_key: dict[str | None, dict[int, Any]] = {}
    for cls in classes:
        by_key.setdefault(type_key(cls), {})[id(cls)] = cls
    names = {}
    for key, same in by_key.items():
        if len({getattr(c, "__module__", None) for c in same.values()}) > 1:
            names.update({i: f"{c.__module__}.{key}" for i, c in same.items()})
    return names


_cached_classes = functools.lru_cache(maxsize=256)(_find_classes)
NO_CLASSES: tuple[dict[str, ClassRecord], dict[str, ClassRecord]] = ({}, {})


def _parts(t: mi.Type) -> list[mi.Type]:
    parts = [getattr(t, a) for a in ("item_type", "key_type", "value_type") if hasattr(t, a)]
    return [*parts, *(getattr(t, "item_types", None) or getattr(t, "types", None) or ())]


def _info_key(t: mi.Type) -> str:
    """Name a field's type as msgspec decodes it: ``int``, ``list[Point]``, ``Union[None,str]``."""
    cls = getattr(t, "cls", None)
    if cls is not None:
        return type_key(cls) or "?"
    if isinstance(t, mi.LiteralType):
        return f"Literal[{','.join(sorted(repr(v) for v in t.values))}]"
    if isinstance(t, mi.UnionType):
        return f"Union[{','.join(sorted(_info_key(x) for x in t.types))}]"
    kind = type(t).__name__.removesuffix("Type")
    if isinstance(t, mi.VarTupleType):
        return f"tuple[{_info_key(t.item_type)},...]"
    parts = _parts(t)
    if parts:
        return f"{_GENERIC.get(kind, kind)}[{','.join(_info_key(p) for p in parts)}]"
    return _SCALARS.get(kind, kind)


_GENERIC = {
    "List": "list",
    "Set": "set",
    "FrozenSet": "frozenset",
    "Tuple": "tuple",
    "Dict": "dict",
}
_SCALARS = {
    **{k: k.lower() for k in ("Int", "Str", "Float", "Bool", "Bytes", "ByteArray", "Date", "Time")},
    "DateTime": "datetime",
    "TimeDelta": "timedelta",
    "MemoryView": "memoryview",
}
