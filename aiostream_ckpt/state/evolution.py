"""State schema evolution: what a checkpoint records of a state's types, and what a restore takes.

Why: stored bytes decode into whatever type the job declares now, and often
without complaint (a ``datetime`` read as ``str``, a ``tuple`` as ``list``, an
``IntEnum`` key as ``int``, a dataclass field written as ``float`` read into
``str`` or failing only at the first read of a key): the app would read
another type after a restore than before it. Flink refuses an incompatible
serializer at restore; so does this. Each state's description in a
checkpoint holds

* ``types``: its ``[map key type, value type]`` by name (:func:`type_key`);
  another name is refused (:func:`check_type_change`);
* ``classes`` (when its types have any): each dataclass, attrs class,
  ``msgspec.Struct``, ``NamedTuple``, ``TypedDict`` and enum its types reach,
  with its layout and its fields' types by name as msgspec decodes them (an
  enum: whether its members are str or int, and their values; a Struct: its
  tag), fields
  the class lost in earlier runs included (stored bytes may still hold
  them), and those stored values may lack (``total=False``,
  ``omit_defaults``, a field lost or gained with a default in an earlier
  run). A field of another type, a field without a default that stored
  values lack, another layout, an enum of int members now of str ones (or
  back) and a Struct's tag changed are refused (:func:`check_class_change`);
  where they only *may* lack it, or an enum lost members stored values may
  hold, a scan of the stored values decides; a field gained with a default,
  or lost, passes.

A type may also widen where its stored values read back unchanged
(:func:`reads_as`): ``int`` now ``int | None``, ``list[int]`` now
``list[int | None]``, ``Literal['a']`` now ``Literal['a', 'b']``. Making a
field optional is the commonest upgrade; refusing it would stop a daemon
whose checkpoints read back exactly as before. Checkpoints from before
either record restore as they did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiostream_ckpt.errors import StateMigrationError
from aiostream_ckpt.state.class_records import (
    NO_CLASSES,
    ClassRecord,
    reached_classes,
    stored_record,
    type_key,
)
from aiostream_ckpt.state.type_names import plain_json, reads_as, unnested, wider


def declared_types(descriptor: Any) -> list[str | None]:
    """Return ``[map key type, value type]`` of ``descriptor`` as :func:`type_key` names.

    Kept with each state in the checkpoint, so that a restore can tell whether
    the job still declares the types its stored bytes were written under.
    """
    return [type_key(tp) for tp in _declared(descriptor)]


def _declared(descriptor: Any) -> tuple[Any, Any]:
    stored, one = descriptor.value_types()
    return descriptor.map_key_type(), stored if one is None else one


def check_type_change(name: str, kind: str, old: Any, new: list[str | None]) -> None:
    """Refuse a restore whose descriptor declares other types than its state was written with.

    What passes: the same types (a dataclass keeps its name: its fields are
    :func:`check_class_change`'s), a type declared where none was (the JSON
    read into it), and checkpoints from before the types were recorded
    (``old`` None), a widened type (:func:`reads_as`), and no type where the
    type was plain JSON (``int``, ``list[str]``: untyped JSON reads it the same).
    """
    if old is None:
        return
    parts = ("map key", "list element" if kind == "list" else "value")
    for part, was, now in zip(parts, old, new, strict=True):
        if was is None or (reads_as(was, now) if now is not None else plain_json(was)):
            continue
        raise StateMigrationError(
            f"state {name!r}: its checkpoint holds {part}s written as {was}, the job now "
            f"declares {now or 'no type'}: they would read back as another type. Keep "
            f"the declared type or widen it (int -> int | None; a dataclass may gain "
            f"fields with defaults or lose fields), or give the state a new name to "
            f"start it empty"
        )


def declared_classes(descriptor: Any) -> dict[str, ClassRecord]:
    """Return the ``classes`` record of ``descriptor``'s declared types (json states)."""
    return dict(_classes(descriptor)[1])


def _classes(descriptor: Any) -> tuple[dict[str, ClassRecord], dict[str, ClassRecord]]:
    """Return the classes the declared types reach (:func:`reached_classes`)."""
    types = _declared(descriptor)
    if descriptor.serializer != "json" or types == (None, None):
        return NO_CLASSES  # pickled bytes do not depend on the declared type
    return reached_classes(types)


def check_class_change(
    name: str,
    old: dict[str, Any] | None,
    descriptor: Any,
    scan: Callable[[], str | None] | None = None,
) -> list[tuple[str, str]]:
    """Refuse a restore where a class keeps its name but its stored fields would not read back.

    A field of another type (``y: float`` now ``y: str``: its stored values
    would read back as another type, or fail at the first read), a field
    gained without a default (stored values lack it), another layout, or a
    positional class (``NamedTuple``, ``array_like`` Struct) that lost or
    reordered fields. ``old`` None: a checkpoint without the record.

    A field now without a default that the record says stored values *may*
    lack (dropped or gained with a default in an earlier run, ``omit_defaults``,
    ``total=False``) is a question only the stored values answer: ``scan``
    decodes them into the job's type (None: all did; else the first error);
    without one it is refused. Returns the ``(class, field)`` pairs the scan
    cleared: every stored value holds them, so the record may say so.
    """
    if not old:
        return []
    moved: dict[str, Any] = {}  # by name without function, where that stays one class
    for cls, rec in old.items():
        moved[unnested(cls)] = None if unnested(cls) in moved else rec
    maybe: list[tuple[str, str, str]] = []  # (class, field or MEMBERS, why)
    for cls, now in _classes(descriptor)[0].items():
        was = old.get(cls) or moved.get(unnested(cls))
        if was is None:
            continue
        why, lacking = _field_change(was, now)
        if why is not None:
            raise _refused(name, cls, why)
        maybe += [(cls, field, _may_lack(field, was, now)) for field in lacking]
    if not maybe:
        return []
    error = "" if scan is None else scan()
    if error is None:
        return [(cls, field) for cls, field, _ in maybe]
    cls, _, why = next((m for m in maybe if _names(m[1], error)), maybe[0])
    raise _refused(name, cls, f"{why} (a stored value: {error})" if error else why)


#: The "field" of an enum whose members the job no longer all declares (see check_class_change).
MEMBERS = ""


def _may_lack(field: str, was: ClassRecord, now: ClassRecord) -> str:
    if field == MEMBERS:
        gone = sorted(set(was["members"]) - set(now["members"]))
        return f"some of members {gone}, which the job no longer declares"
    return f"some without field {field!r}, which the job now declares with no default"


def _names(field: str, error: str) -> bool:
    """Whether msgspec's ``error`` is about ``field`` (or, MEMBERS, an enum's value)."""
    return "Invalid enum value" in error if field == MEMBERS else f"`{field}`" in error


def _refused(name: str, cls: str, why: str) -> StateMigrationError:
    return StateMigrationError(
        f"state {name!r}: its checkpoint holds {cls} values {why}: they would not "
        f"read back as written. Keep the field's type or widen it (int -> int | None; "
        f"a class may gain fields with defaults or lose fields), give the field a "
        f"new name, or give the state a new name to start it empty"
    )


def _field_change(was: ClassRecord, now: ClassRecord) -> tuple[str | None, list[str]]:
    """Say how ``now`` (a live record) cannot read what was stored under ``was``, or None.

    Also return the fields ``now`` requires that stored values may lack.
    """
    if was["layout"] != now["layout"]:
        return f"stored as an {was['layout']}, the job now declares an {now['layout']}", []
    if now["layout"] == "enum":
        if was.get("values") != now["values"]:
            return f"of {was.get('values')} members, the job now declares {now['values']} ones", []
        return None, [MEMBERS] if set(was.get("members", ())) - set(now["members"]) else []
    if (why := _tag_change(was, now)) is not None:
        return why, []
    old_types = dict(was["fields"])
    if now["layout"] == "array":
        old_names, names = [f[0] for f in was["fields"]], [f[0] for f in now["fields"]]
        if names[: len(old_names)] != old_names:
            return f"with fields {old_names} in this order, the job now declares {names}", []
    absent = was.get("absent", ())
    maybe = []
    for field, tp, required in now["fields"]:
        if field not in old_types:
            if required:
                return f"without field {field!r}, which the job now declares with no default", []
            continue
        if not reads_as(old_types[field], tp):
            why = f"whose field {field!r} was written as {old_types[field]}, the job now declares"
            return f"{why} {tp}", []
        if required and field in absent:
            maybe.append(field)
    return None, maybe


def _tag_change(was: ClassRecord, now: ClassRecord) -> str | None:
    """Say how a Struct's stored tags would not read under its tag now, or None."""
    untagged = [None, None]
    tag = (now.get("tags") or [untagged])[0]
    for form in was.get("tags") or [untagged]:
        if not _reads_tag(form, tag, now):
            return f"tagged {_tag(form)}, the job now declares {_tag(tag)}"
    return None


def _reads_tag(form: list[Any], tag: list[Any], now: ClassRecord) -> bool:
    """Whether a value stored with tag ``form`` decodes under ``tag`` (``[field, value]``).

    An array's tag is its first item: any change misreads. An object's tag
    lost is an unknown field, ignored; one gained, or under another field,
    is missing from stored values, which only a union of Structs needs. The
    same field with another value fails.
    """
    if form == tag:
        return True
    if now["layout"] == "array":
        return False
    if tag[0] is None:
        return True
    return form[0] != tag[0] and not now.get("union")


def _tag(form: list[Any]) -> str:
    return "with no tag" if form[0] is None else f"{form[0]}={form[1]!r}"


def cleared(
    classes: dict[str, Any], fields: list[tuple[str, str]], live: dict[str, Any]
) -> dict[str, Any]:
    """Return ``classes`` without ``fields`` among those stored values may lack (scanned).

    An enum's (MEMBERS) members are then the ``live`` record's: no stored
    value holds one of the others.
    """
    out = dict(classes)
    for cls, field in fields:
        rec = out.get(cls)
        if rec is None:
            continue
        if field == MEMBERS:
            out[cls] = {**rec, "members": live[cls]["members"]}
        elif field in rec.get("absent", ()):
            out[cls] = stored_record({**rec, "absent": [f for f in rec["absent"] if f != field]})
    return out


def merge_classes(old: dict[str, Any] | None, new: dict[str, Any] | None) -> dict[str, Any]:
    """Return the ``classes`` record that covers stored values written under both.

    A class's fields are the union (fields lost since stay known: stored
    values may still hold them), as are fields values may lack ("absent"), to
    which a field only one side has is added (values written under the other
    lack it: a field dropped, or gained with a default), a field's type the
    wider of the two
    (:func:`wider`); classes only one side knows are kept. ValueError where
    they disagree on a field's type or a class's layout.
    """
    merged = dict(old or {})
    for cls, rec in (new or {}).items():
        was = merged.get(cls)
        if was is None or was == rec:
            merged[cls] = rec
            continue
        if was["layout"] != rec["layout"] or was.get("values") != rec.get("values"):
            raise ValueError(f"{cls} is stored as {_form(was)} and {_form(rec)}")
        fields = dict(was["fields"])
        for field, tp in rec["fields"]:
            both = fields.setdefault(field, tp)
            fields[field] = wider(both, tp)
            if fields[field] is None:
                raise ValueError(f"{cls}.{field} is stored as {both} and {tp}")
        names = [f for f, _ in rec["fields"]] + [f for f, _ in was["fields"]]
        merged[cls] = stored_record(
            {
                "layout": rec["layout"],
                "fields": [[f, fields[f]] for f in dict.fromkeys(names)],
                "absent": sorted(
                    {*was.get("absent", ()), *rec.get("absent", ())}
                    | {f for f, _ in was["fields"]} ^ {f for f, _ in rec["fields"]}
                ),
                "tags": _merged_tags(was, rec),
                "values": rec.get("values"),
                "members": sorted({*was.get("members", ()), *rec.get("members", ())}),
            }
        )
    return merged


def _form(rec: ClassRecord) -> str:
    return f"an {rec['layout']}" + (f" of {rec['values']}" if rec.get("values") else "")


def _merged_tags(was: ClassRecord, rec: ClassRecord) -> list[list[Any]] | None:
    """Return the tags values stored under either record carry (None: all untagged)."""
    forms = [*(was.get("tags") or [[None, None]]), *(rec.get("tags") or [[None, None]])]
    unique = {repr(f): f for f in forms}
    return None if list(unique) == [repr([None, None])] else [unique[k] for k in sorted(unique)]


def merge_types(old: list[str | None], new: list[str | None]) -> list[str | None]:
    """Return declared types that read values stored under both (:func:`wider`).

    None (untyped in one record) takes the other's. ValueError where neither
    reads the other's values.
    """
    merged = []
    for a, b in zip(old, new, strict=True):
        both = a or b if a is None or b is None else wider(a, b)
        if both is None and (a, b) != (None, None):
            raise ValueError(f"a type is stored as {a} and {b}")
        merged.append(both)
    return merged
