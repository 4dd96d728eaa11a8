"""Bytes for keyed state: value codecs and the LMDB key layout.

The key layout is ``key_group (u16 BE) | len(name) (u8) | name | len(key) (u16 BE) |
key | map_key``. The key group comes first so that one contiguous range of key
groups is one contiguous range of LMDB keys: restoring at another parallelism
is a range scan, not a filter over everything. Keys are orjson bytes (the same
canonical bytes the key-group hash is computed from); values are orjson by
default and pickle only when a descriptor opts in, because unpickling
checkpoint bytes runs code.
"""

from __future__ import annotations

import struct
from typing import Any

import orjson

from aiostream_ckpt.errors import StateError

#: LMDB's compile-time key limit (``mdb_env_get_maxkeysize``); longer keys cannot be stored.
MAX_DB_KEY_BYTES = 511

_TS = struct.Struct(">d")
TS_SIZE = _TS.size
pack_ts = _TS.pack
unpack_ts = _TS.unpack_from


def name_part(name: str) -> bytes:
    """Length-prefixed state name, the second component of every LMDB key."""
    raw = name.encode()
    if len(raw) > 255:
        raise StateError(f"state name {name!r} is longer than 255 bytes")
    return bytes((len(raw),)) + raw


def key_group_bytes(key_group: int) -> bytes:
    return key_group.to_bytes(2, "big")


def state_prefixes(name: str, max_parallelism: int) -> list[bytes]:
    """``key_group | name`` prefix of one state, indexed by key group.

    Precomputed so that building an LMDB key is one list index and two concatenations.
    """
    part = name_part(name)
    return [key_group_bytes(kg) + part for kg in range(max_parallelism)]


def decode_key(key_bytes: bytes) -> Any:
    """Inverse of :func:`keygroups.serialize_key`; JSON arrays come back as tuples.

    Tuples are what keyed streams use as composite keys (lists are not hashable).

    >>> decode_key(b'["a",[1,2]]')
    ('a', (1, 2))
    """
    return _tuplify(orjson.loads(key_bytes))


def _tuplify(obj: Any) -> Any:
    if isinstance(obj, list):
        return tuple(_tuplify(x) for x in obj)
    return obj


def describe_encode_error(state: str, key: Any, value: Any, exc: Exception) -> StateError:
    """Build the error for an unserializable value, naming state, key and type."""
    return StateError(
        f"state {state!r}, key {key!r}: cannot serialize value of type "
        f"{type(value).__name__} ({exc}); use JSON-able values or serializer='pickle'",
        retriable=False,
    )
