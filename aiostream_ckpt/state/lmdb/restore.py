"""Rebuilding a working LMDB from snapshot handles, possibly of other parallelisms.

Every chain file is checked against its handle's sha256 before anything is
applied, so a corrupt checkpoint fails restore instead of half-loading. When
the one handle's key groups all belong to the new instance (same parallelism,
the common case) the full file is copied as the new ``data.mdb``; otherwise the
new instance's key-group range is one contiguous LMDB key range in each old
full file and is copied with a single cursor scan.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb

from aiostream_ckpt.errors import CorruptCheckpointError, StateError, StateMigrationError
from aiostream_ckpt.state.backend import StateHandle
from aiostream_ckpt.state.evolution import merge_classes, merge_types
from aiostream_ckpt.state.keygroups import KeyGroupRange
from aiostream_ckpt.state.lmdb.snapshot import ChangeLog, Put, Record, read_delta, verify_file
from aiostream_ckpt.state.serde import TS_SIZE, key_group_bytes, name_part, unpack_ts

SUPPORTED_FORMATS = (1,)

#: py-lmdb refuses to open one file twice in a process, and at another
#: parallelism several new instances restore from the same old file at once.
_open_guard = threading.Lock()
_file_locks: dict[str, threading.Lock] = {}


def _file_lock(path: Path) -> threading.Lock:
    with _open_guard:
        return _file_locks.setdefault(str(path.resolve()), threading.Lock())


@dataclass(slots=True)
class _Source:
    base: Path | None  # None when the base was copied wholesale as data.mdb
    deltas: list[tuple[Path, str]]


@dataclass(slots=True)
class RestorePlan:
    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the handles' distinct ``keys`` records, None for a handle without one
    #: (see :mod:`~aiostream_ckpt.state.key_evolution`)
    keys: list[dict[str, Any] | None] = field(default_factory=list)
    copy_base: Path | None = None
    sources: list[_Source] = field(default_factory=list)
    #: ``(checkpoint id, chain)`` when the working copy is exactly one handle's chain
    #: (``copy_base``): the next snapshot may build on it (see ``SnapshotStrategy.restored``)
    chain_base: tuple[int, list[dict[str, Any]]] | None = None


def plan(root: Path, handles: Any, own: KeyGroupRange, max_parallelism: int) -> RestorePlan:
    """Validate handles and verify their files; decide how each is applied."""
    result = RestorePlan()
    relevant: list[tuple[KeyGroupRange, StateHandle]] = []
    for h in handles:
        if h.get("backend") != "lmdb" or h.get("format") not in SUPPORTED_FORMATS:
            raise StateMigrationError(
                f"not an lmdb state handle of a supported format: backend={h.get('backend')!r} "
                f"format={h.get('format')!r}"
            )
        if h["max_parallelism"] != max_parallelism:
            raise StateMigrationError(
                f"snapshot has max_parallelism {h['max_parallelism']}, the job {max_parallelism}; "
                "key groups cannot be mapped"
            )
        if (keys := h.get("keys")) not in result.keys:
            result.keys.append(keys)
        for name, meta in h["states"].items():
            seen = result.states.get(name)
            result.states[name] = dict(meta) if seen is None else _merged(name, seen, meta)
        kgr = KeyGroupRange.from_json(h["key_group_range"])
        if kgr.intersects(own):
            for other, _ in relevant:
                if other.intersects(kgr):
                    raise StateMigrationError(f"handles overlap: key groups {other} and {kgr}")
            relevant.append((kgr, h))
    for kgr, h in relevant:
        chain = h["chain"]
        if not chain or chain[0]["kind"] != "full" or any(e["kind"] != "delta" for e in chain[1:]):
            raise CorruptCheckpointError(f"malformed lmdb state chain in handle: {chain!r}")
        paths = [verify_file(root, e) for e in chain]
        base: Path | None = paths[0]
        if len(relevant) == 1 and own.start <= kgr.start and kgr.end <= own.end:
            result.copy_base, base = paths[0], None
            if isinstance(cid := h.get("checkpoint_id"), int):
                result.chain_base = (cid, [dict(e) for e in chain])
        deltas = [(p, e["path"]) for p, e in zip(paths[1:], chain[1:], strict=True)]
        result.sources.append(_Source(base, deltas))
    return result


def _merged(name: str, seen: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """One state's description from two old instances' handles; they must agree.

    Declared types may be known to one and not the other: an instance that
    never created the state in its run kept what it restored (no types from
    before they were recorded, or none declared yet), and the other's
    declaration holds for both (the stored bytes are the same JSON). One may
    have widened a type or field since (``int`` now ``int | None``): the
    wider reads both.
    """
    if seen == meta:
        return seen
    old_types, new_types = seen.get("types"), meta.get("types")
    if {**seen, "types": None, "classes": None} == {**meta, "types": None, "classes": None}:
        merged = dict(meta) if old_types is None else dict(seen)
        try:
            if old_types is not None and new_types is not None:
                merged["types"] = merge_types(old_types, new_types)
            if seen.get("classes") or meta.get("classes"):
                # one instance's class may have gained, lost or widened fields since
                # the other's record was written: both kinds of values are restored
                merged["classes"] = merge_classes(seen.get("classes"), meta.get("classes"))
        except ValueError as exc:
            raise _differs(name, seen, meta, f" ({exc})") from exc
        return merged
    raise _differs(name, seen, meta)


def _differs(
    name: str, seen: dict[str, Any], meta: dict[str, Any], why: str = ""
) -> StateMigrationError:
    return StateMigrationError(f"state {name!r} differs between handles{why}: {seen} {meta}")


def apply(env: lmdb.Environment, restore_plan: RestorePlan, own: KeyGroupRange) -> None:
    """Load the planned bases (range-scanned) and replay their deltas in order."""
    lo = key_group_bytes(own.start)
    hi = key_group_bytes(own.end + 1) if own.end + 1 < 1 << 16 else b"\xff\xff\xff"
    for source in restore_plan.sources:
        if source.base is not None:
            with _file_lock(source.base):
                src = lmdb.open(str(source.base), subdir=False, readonly=True, lock=False)
                try:
                    with src.begin() as stxn, env.begin(write=True) as wtxn:
                        cur = stxn.cursor()
                        if cur.set_range(lo):
                            wtxn.cursor().putmulti(_until(cur, hi))
                except lmdb.Error as exc:
                    raise CorruptCheckpointError(f"state file {source.base.name}: {exc}") from exc
                finally:
                    src.close()
        for path, name in source.deltas:
            blocks = read_delta(path, name)
            if source.base is not None:  # range-scanned base: keep only our key groups
                blocks = [[r for r in block if lo <= r[0] < hi] for block in blocks]
            _replay(env, blocks)


def _replay(env: lmdb.Environment, blocks: list[list[Record]]) -> None:
    """Apply one delta's record blocks (each all puts or all deletes) in one transaction.

    A delta holds each key at most once, so its puts and deletes commute.
    """
    with env.begin(write=True) as wtxn:
        cur = wtxn.cursor()
        delete = wtxn.delete
        for block in blocks:
            if not block:
                continue
            if block[0][1] is None:
                for key, _ in block:
                    delete(key)
            else:
                cur.putmulti(block)  # type: ignore[arg-type]  # all puts


def _until(cur: Any, hi: bytes) -> Any:
    for key, value in cur:
        if key >= hi:
            return
        yield key, value


def convert_pickle_to_json(
    txn: lmdb.Transaction[bytes],
    name: str,
    own: KeyGroupRange,
    ttl: bool,
    changed: ChangeLog | None,
    encode: Callable[[Any], bytes],
) -> int:
    """Rewrite a pickled state's values as JSON (only when the backend allows pickle).

    ``encode`` is the json descriptor's, with its check: a value that would not
    read back the same (a tuple for an untyped state) is refused, not converted.
    """
    head = TS_SIZE if ttl else 0
    converted: list[Put] = []
    for key, raw in _entries(txn, name, own):
        value = pickle.loads(raw[head:])
        try:
            converted.append((key, raw[:head] + encode(value)))
        except StateError as exc:
            raise StateMigrationError(
                f"state {name!r}: a pickled value cannot be converted to json: {exc}"
            ) from exc
    txn.cursor().putmulti(converted)
    if changed is not None:
        changed.add(name, converted)
    return len(converted)


def stored_values(
    txn: lmdb.Transaction[bytes], name: str, own: KeyGroupRange, ttl: tuple[float, float] | None
) -> Iterator[bytes]:
    """Yield the encoded values of state ``name`` in key groups ``own`` (each map entry's).

    ``ttl``: ``(now, ttl seconds)`` of a TTL state, whose expired values are
    skipped: no read returns or decodes one (``TtlCodec._decode``).
    """
    if ttl is None:
        for _, raw in _entries(txn, name, own):
            yield raw
        return
    now, span = ttl
    for _, raw in _entries(txn, name, own):
        if now - unpack_ts(raw)[0] < span:
            yield raw[TS_SIZE:]


def stored_keys(txn: lmdb.Transaction[bytes], own: KeyGroupRange) -> Iterator[bytes]:
    """Yield the distinct stream keys' bytes stored in key groups ``own``, of every state.

    Every keyed state, timers and window contents included, is stored under
    ``key_group | name | len(key) | key | ...`` (see :mod:`~aiostream_ckpt.state.serde`);
    a key is yielded once per key group (the set holds one group's keys).
    """
    cur = txn.cursor()
    for kg in range(own.start, own.end + 1):
        prefix = key_group_bytes(kg)
        if not cur.set_range(prefix):
            return
        seen: set[bytes] = set()
        for db_key in cur.iternext(values=False):
            if not db_key.startswith(prefix):
                break
            at = 5 + db_key[2]
            kb = db_key[at : at + int.from_bytes(db_key[at - 2 : at], "big")]
            if kb not in seen:
                seen.add(kb)
                yield kb


def stored_map_keys(txn: lmdb.Transaction[bytes], name: str, own: KeyGroupRange) -> Iterator[bytes]:
    """Yield the encoded map keys of map state ``name`` in key groups ``own``.

    Expired entries' too: a read decodes every entry's map key before it
    looks at the entry's timestamp (``MapStateImpl._load``).
    """
    head = len(key_group_bytes(0)) + len(name_part(name))
    for key, _ in _entries(txn, name, own):
        stream_key = int.from_bytes(key[head : head + 2], "big")
        yield key[head + 2 + stream_key :]


def _entries(
    txn: lmdb.Transaction[bytes], name: str, own: KeyGroupRange
) -> Iterator[tuple[bytes, bytes]]:
    part = name_part(name)
    cur = txn.cursor()
    for kg in range(own.start, own.end + 1):
        prefix = key_group_bytes(kg) + part
        if not cur.set_range(prefix):
            return
        for key, raw in cur:
            if not key.startswith(prefix):
                break
            yield key, raw
