"""What a state is recorded as in a snapshot handle, and which changes of it a restore accepts.

A handle's ``states`` hold each state's kind, serializer, TTL flag and declared
types/classes (:func:`describe`). A job that declares a state differently from
what it restored goes through :func:`check_migration`: the record decides where
it can (kind, serializer, types), and a scan of the stored values
(:func:`misfit`) only where it cannot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lmdb
import msgspec

from aiostream_ckpt.errors import StateError, StateMigrationError
from aiostream_ckpt.state.descriptors import StateDescriptor
from aiostream_ckpt.state.evolution import (
    check_class_change,
    check_type_change,
    declared_classes,
    declared_types,
)
from aiostream_ckpt.state.key_evolution import check_map_key_change
from aiostream_ckpt.state.keygroups import KeyGroupRange
from aiostream_ckpt.state.lmdb import restore as restore_mod
from aiostream_ckpt.state.lmdb.map_state import MapStateImpl, TtlMapState
from aiostream_ckpt.state.lmdb.states import (
    KeyedStateBase,
    ListStateImpl,
    ReducingStateImpl,
    TtlListState,
    TtlReducingState,
    TtlValueState,
    TypedReducingState,
    TypedValueState,
    ValueStateImpl,
)

_CLASSES: dict[tuple[str, bool], type[KeyedStateBase]] = {
    ("value", False): ValueStateImpl,
    ("value", True): TtlValueState,
    ("list", False): ListStateImpl,
    ("list", True): TtlListState,
    ("map", False): MapStateImpl,
    ("map", True): TtlMapState,
    ("reducing", False): ReducingStateImpl,
    ("reducing", True): TtlReducingState,
}


#: States whose untyped fast path (an exact scalar kept by reference) a declared type replaces.
_TYPED: dict[type[KeyedStateBase] | None, type[KeyedStateBase]] = {
    ValueStateImpl: TypedValueState,
    ReducingStateImpl: TypedReducingState,
}


def state_class(descriptor: StateDescriptor) -> type[KeyedStateBase]:
    """Return the class that implements ``descriptor``'s state."""
    cls = _CLASSES.get((descriptor.kind, descriptor.ttl is not None))
    if descriptor.value_types()[0] is not None and descriptor.serializer == "json":
        cls = _TYPED.get(cls, cls)  # checks every value it is given
    if cls is None:
        raise StateError(f"state {descriptor.name!r}: unsupported descriptor {descriptor!r}")
    return cls


def describe(d: StateDescriptor) -> dict[str, Any]:
    """Return what a handle records of a state (compared on restore and on re-creation)."""
    described: dict[str, Any] = {
        "kind": d.kind,
        "serializer": d.serializer,
        "ttl": d.ttl is not None,
        "types": declared_types(d),
    }
    if classes := declared_classes(d):
        described["classes"] = classes
    return described


def check_migration(
    descriptor: StateDescriptor,
    old: dict[str, Any],
    new: dict[str, Any],
    *,
    allow_pickle: bool,
    misfit: Callable[[], str | None],
    convert: Callable[[], None],
) -> list[tuple[str, str]]:
    """Accept a changed descriptor only where the stored bytes can be converted safely.

    ``misfit`` scans the stored values (see :func:`misfit`), ``convert``
    rewrites a pickled state as JSON. Returns the class fields a scan of the
    stored values found in every one (see :func:`check_class_change`).
    """
    name = descriptor.name
    if old["kind"] != new["kind"] or old["ttl"] != new["ttl"]:
        raise StateMigrationError(
            f"state {name!r} was snapshotted as {old}, the job now declares {new}"
        )
    if old["serializer"] == new["serializer"]:
        if new["serializer"] != "json":  # pickled bytes do not depend on the declared type
            return []
        check_type_change(name, new["kind"], old.get("types"), new["types"])
        check_map_key_change(name, old.get("classes"), descriptor.map_key_type())
        return check_class_change(name, old.get("classes"), descriptor, misfit)
    if (old["serializer"], new["serializer"]) != ("pickle", "json"):
        raise StateMigrationError(
            f"state {name!r} was snapshotted with serializer {old['serializer']!r}, "
            f"the job now declares {new['serializer']!r}"
        )
    if not allow_pickle:
        raise StateMigrationError(
            f"state {name!r} was snapshotted with pickle; refusing to unpickle it for a "
            "json descriptor (declare serializer='pickle', or set allow_pickle=True to "
            "convert it)"
        )
    convert()
    return []


def misfit(
    txn: lmdb.Transaction[bytes],
    descriptor: StateDescriptor,
    own: KeyGroupRange,
    now: Callable[[], float],
) -> str | None:
    """Decode every stored value of a state into its declared type: the first error, or None.

    Only where the record cannot say (a field now required that values
    written in earlier runs may lack, an enum that lost members): a scan
    of this instance's values, expired ones (TTL) skipped: no read decodes
    them; and of a map state's map keys, whose enums the record shares.
    """
    ttl = None if descriptor.ttl is None else (now(), descriptor.ttl.ttl)
    if (value_type := descriptor.value_types()[0]) is not None:  # else: plain JSON
        decode = msgspec.json.Decoder(value_type).decode
        for raw in restore_mod.stored_values(txn, descriptor.name, own, ttl):
            try:
                decode(raw)
            except msgspec.DecodeError as exc:  # ValidationError too
                return str(exc)
    if (key_type := descriptor.map_key_type()) is not None:
        decode = msgspec.json.Decoder(key_type).decode
        for raw in restore_mod.stored_map_keys(txn, descriptor.name, own):
            try:
                decode(raw)
            except msgspec.DecodeError as exc:
                return f"{exc}, a map key"
    return None
