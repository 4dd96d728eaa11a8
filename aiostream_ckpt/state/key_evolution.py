"""Stream key types across a restore: what a checkpoint records of ``key_by(key_type=)``.

Why: keyed state is found by its key's JSON bytes (the key group hashes
them), and read back (``ctx.current_key``, timers, window keys) by the
declared key type. A job restored under another key type (``int`` keys now
``str``: ``1`` is stored, ``"1"`` looked up) found nothing and started every
key empty, without a word; a dataclass key that gained a field encodes
every key otherwise. Flink checks the key serializer at restore; so does
this. Each operator instance's handle holds ``keys``: the declared type by
name (:func:`~aiostream_ckpt.state.class_records.type_key`, None: undeclared)
and the classes it reaches (as a state's ``classes`` record). What passes:
the same type, a widened one whose stored keys read back unchanged (``int``
now ``int | None``), none where the type was plain JSON (``int``,
``str``, tuples of them: undeclared keys read arrays as tuples), and a
type declared where none was (or where a handle has no record: written
before it was kept) if every stored key reads back as the same bytes:
untyped keys' kinds are not recorded, so the restore scans this
instance's stored keys once (:func:`check_stored_keys`; ``5`` stored, now
``key_type=str``, would look up ``"5"``). So does a key enum that lost
members (:func:`lost_members`): only the stored keys say whether one holds
them (the next checkpoint records the job's members: scanned once).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
import orjson

from aiostream_ckpt.errors import StateMigrationError
from aiostream_ckpt.state.class_records import ClassRecord, class_records, type_key
from aiostream_ckpt.state.codecs import type_name
from aiostream_ckpt.state.type_names import plain_key, reads_as

#: A handle's ``keys`` record: {"type": name or None, "classes": {name: record}}.
KeyRecord = dict[str, Any]


def described_keys(key_type: Any) -> KeyRecord:
    """Return the ``keys`` record of a declared key type (None: undeclared)."""
    record: KeyRecord = {"type": type_key(key_type)}
    if key_type is not None and (classes := class_records(key_type)):
        record["classes"] = classes
    return record


def check_key_change(operator_uid: str, old: KeyRecord | None, key_type: Any) -> None:
    """Refuse a restore whose ``key_type`` would look up or read stored keys otherwise.

    A class a key type reaches must keep its fields, their order and its
    tag (any change re-encodes every key), their types may widen; an enum
    keeps its kind of members. ``old`` None: a handle without the record.
    """
    if old is None:
        return
    was, now = old.get("type"), type_key(key_type)
    why = None
    if was is not None and not (reads_as(was, now) if now is not None else plain_key(was)):
        why = f"keys written as {was}, the job now declares {_declared(now)}"
    elif was is not None and now is not None:
        why = _class_change(old.get("classes") or {}, described_keys(key_type).get("classes", {}))
    if why is not None:
        raise StateMigrationError(
            f"operator {operator_uid!r}: its checkpoint holds {why}: its keyed state would "
            f"be looked up under other keys or read back as another type. Keep the key "
            f"type (key_by(..., key_type=)) or widen it (int -> int | None), or give the "
            f"operator a new uid to start its state empty"
        )


def keys_unrecorded(records: Iterable[KeyRecord | None], key_type: Any) -> bool:
    """Whether a restore under ``key_type`` must scan its stored keys (see the module doc)."""
    return key_type is not None and any(r is None or r.get("type") is None for r in records)


def lost_members(records: Iterable[KeyRecord | None], key_type: Any) -> str | None:
    """Say which key enum members the records hold and ``key_type`` no longer declares, or None.

    A stored key may hold one: read back (``keys()``, timers), it would fail
    long after the restore, so the restore scans the stored keys.
    """
    now = described_keys(key_type).get("classes") or {}
    for record in records:
        for cls, was in ((record or {}).get("classes") or {}).items():
            live = now.get(cls)
            if live is None or live["layout"] != "enum":
                continue
            if gone := sorted(set(was.get("members", ())) - set(live["members"])):
                return f"{cls} keys of members {gone}, which the job no longer declares: one stored"
    return None


def check_stored_keys(
    operator_uid: str, key_type: Any, stored: Iterable[bytes], lost: str | None = None
) -> None:
    """Refuse a restore under ``key_type`` unless each stored key reads back as its bytes.

    Each key is decoded into ``key_type`` (as the declared key codec reads
    keys) and encoded again: other bytes (``5`` read as ``int | str``
    stays ``5``, but ``float`` makes it ``5.0``) would hash and look it up
    elsewhere. ``stored``: the instance's keys (its key groups only).
    """
    decode = msgspec.json.Decoder(key_type).decode
    for kb in stored:
        try:
            back = orjson.dumps(decode(kb))
            why = None if back == kb else f"it reads back as {back.decode()}"
        except (msgspec.DecodeError, TypeError) as exc:  # ValidationError too
            why = str(exc)
        if why is not None:
            held = lost or (
                f"keys written without a key_type, the job now declares key_type "
                f"{type_name(key_type)}, which a stored key does not fit"
            )
            raise StateMigrationError(
                f"operator {operator_uid!r}: its checkpoint holds {held}: "
                f"{kb.decode()} ({why}): its keyed state would be "
                f"looked up under other keys. Keep the key selector and key type of before "
                f"(declare a type its keys read back as unchanged); there is no state "
                f"processor to rewrite stored keys, so other keys need a new operator uid "
                f"(its state starts empty; --allow-non-restored-state drops the old)"
            )


def check_map_key_change(name: str, old: dict[str, ClassRecord] | None, key_type: Any) -> None:
    """Refuse a restore whose map key classes would encode stored map keys otherwise.

    A map's entries are found by their key's JSON bytes too, so a key class
    that gained a field (even with a default), lost or reordered one misses
    every stored entry; the value classes' looser rules do not hold for keys.
    Keyed (LMDB) map state only: broadcast state rewrites its entries on
    restore. ``old``: the state's ``classes`` record (None: none kept).
    """
    if not old or key_type is None:
        return
    why = _class_change(old, class_records(key_type))
    if why is not None:
        raise StateMigrationError(
            f"state {name!r}: its checkpoint holds map {why}: its entries would be looked up "
            f"under other keys. Keep the key class's fields and their order (a field's type "
            f"may widen), or give the state a new name to start it empty"
        )


def _declared(name: str | None) -> str:
    return "no key_type" if name is None else f"key_type {name}"


def _class_change(old: dict[str, ClassRecord], new: dict[str, ClassRecord]) -> str | None:
    """Say how a key class's record changed so that its keys encode or read otherwise."""
    for cls, now in new.items():
        was = old.get(cls)
        if was is None:
            continue
        for part in ("layout", "values", "tags"):
            if was.get(part) != now.get(part):
                return f"{cls} keys of {part} {was.get(part)}, the job now declares {now.get(part)}"
        names, old_names = [f[0] for f in now["fields"]], [f[0] for f in was["fields"]]
        if names != old_names:
            return f"{cls} keys with fields {old_names}, the job now declares {names}"
        for (field, tp), (_, now_tp) in zip(was["fields"], now["fields"], strict=True):
            if not reads_as(tp, now_tp):
                return f"{cls} keys whose field {field!r} was written as {tp}, now {now_tp}"
    return None
