"""Value, list, map and reducing state with a write-behind cache in front of LMDB.

The hot path is plain dict operations: a read looks in ``_cache`` and goes to
LMDB only on a miss (negative results are cached too, as ``None``), a write
stores into ``_cache`` and remembers the key in ``_dirty``. Dirty entries reach
LMDB only in :meth:`KeyedStateBase.flush`, which the backend calls inside one
write transaction at the snapshot barrier or when a cache grows past its
limit. Everything is single-threaded on the event loop; snapshot threads only
ever see LMDB, never these dicts.

As in Flink, storing ``None`` in a value/reducing state clears it, and a value
returned by ``value()``/``get()`` is the cached object: mutate it and call
``update()``, or the change may be lost. TTL'd states cache ``(value, ts)``
pairs and store ``ts (f64 BE) | payload``; they live in subclasses so that
states without TTL pay nothing for it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import lmdb
import orjson

from aiostream_ckpt.errors import StateError
from aiostream_ckpt.state.backend import KeyContext
from aiostream_ckpt.state.descriptors import (
    ReducingStateDescriptor,
    StateDescriptor,
    TtlUpdateType,
    ValueStateDescriptor,
)
from aiostream_ckpt.state.keygroups import KeyGroupRange
from aiostream_ckpt.state.serde import (
    MAX_DB_KEY_BYTES,
    TS_SIZE,
    describe_encode_error,
    pack_ts,
    state_prefixes,
    unpack_ts,
    value_codec,
)

_LEN2 = [n.to_bytes(2, "big") for n in range(MAX_DB_KEY_BYTES + 1)]
_MISS: Any = object()  # not in the cache: ask LMDB
_DELETED: Any = object()  # a map entry known to be absent


class StateHost(Protocol):
    """What a state needs from its backend."""

    def read_txn(self) -> lmdb.Transaction[bytes]:
        """Return a read transaction that sees every flushed write."""
        ...

    def cache_full(self, state: KeyedStateBase) -> None:
        """Flush every state, then let ``state`` evict."""
        ...


class KeyedStateBase:
    """Cache, dirty set and LMDB key building shared by every state kind."""

    __slots__ = (
        "_cache",
        "_ctx",
        "_dirty",
        "_dumps",
        "_host",
        "_kg_end",
        "_kg_start",
        "_limit",
        "_loads",
        "_maxp",
        "_now",
        "_prefixes",
        "_refresh_on_read",
        "_ttl",
        "descriptor",
        "name",
    )

    kind: ClassVar[str] = ""
    #: True when a cache entry is the user value and None means "delete" (no TTL, not a list).
    _plain_codec: ClassVar[bool] = False

    def __init__(
        self,
        descriptor: StateDescriptor,
        *,
        host: StateHost,
        key_context: KeyContext,
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        now: Callable[[], float],
    ) -> None:
        self.descriptor = descriptor
        self.name = descriptor.name
        self._host = host
        self._ctx = key_context
        self._cache: dict[Any, Any] = {}
        self._dirty: Any = set()
        self._limit = 1_000_000
        self._maxp = max_parallelism
        self._kg_start = key_group_range.start
        self._kg_end = key_group_range.end
        self._prefixes = state_prefixes(descriptor.name, max_parallelism)
        self._dumps, self._loads = value_codec(descriptor.serializer)
        self._now = now
        ttl = descriptor.ttl
        self._ttl = ttl.ttl if ttl is not None else 0.0
        self._refresh_on_read = ttl is not None and (
            ttl.update_type is TtlUpdateType.ON_READ_AND_WRITE
        )

    # -- keys -------------------------------------------------------------
    def db_key(self, key: Any) -> bytes:
        """LMDB key of ``key`` in this state; refuses keys outside this instance's range."""
        try:
            kb = orjson.dumps(key)
        except TypeError as exc:
            raise StateError(
                f"state {self.name!r}: key {key!r} is not serializable: {exc}"
            ) from exc
        kg = zlib.crc32(kb) % self._maxp
        if not self._kg_start <= kg <= self._kg_end:
            raise StateError(
                f"state {self.name!r}: key {key!r} is in key group {kg}, outside this "
                f"instance's range [{self._kg_start}, {self._kg_end}] (partitioning bug?)"
            )
        db_key = self._prefixes[kg] + len(kb).to_bytes(2, "big") + kb
        if len(db_key) > MAX_DB_KEY_BYTES:
            raise StateError(
                f"state {self.name!r}: key {key!r} makes an LMDB key of {len(db_key)} bytes; "
                f"the limit is {MAX_DB_KEY_BYTES}"
            )
        return db_key

    # -- codec (overridden for TTL) ------------------------------------------
    def _decode(self, raw: bytes) -> Any:
        return self._loads(raw)

    def _encode(self, entry: Any) -> bytes | None:
        """Bytes to store for a cache entry, or None to delete it."""
        return None if entry is None else self._dumps(entry)

    def store_live(self, raw: bytes) -> bool:
        """Whether a stored value is still visible (TTL states check its timestamp)."""
        return True

    def cached_live(self, entry: Any) -> bool:
        return entry is not None

    # -- cache primitives (overridden for TTL) -------------------------------
    def _miss(self, key: Any) -> Any:
        raw = self._host.read_txn().get(self.db_key(key))
        entry = None if raw is None else self._decode(raw)
        cache = self._cache
        cache[key] = entry
        if len(cache) > self._limit:
            self._host.cache_full(self)
        return entry

    def _read(self, key: Any) -> Any:
        entry = self._cache.get(key, _MISS)
        if entry is _MISS:
            entry = self._miss(key)
        return entry

    def _write(self, key: Any, value: Any) -> None:
        cache = self._cache
        cache[key] = value
        self._dirty.add(key)
        if len(cache) > self._limit:
            self._host.cache_full(self)

    # -- backend side ----------------------------------------------------------
    def set_cache_limit(self, limit: int) -> None:
        self._limit = max(2, limit)

    def cache_size(self) -> int:
        return len(self._cache)

    def has_dirty(self) -> bool:
        return bool(self._dirty)

    def flush(self, txn: lmdb.Transaction[bytes], changed: set[bytes] | None) -> int:
        """Write dirty entries into ``txn``; record their LMDB keys in ``changed``.

        This loop is the per-key cost of the synchronous snapshot part, hence the
        inlined key building and one ``putmulti`` instead of a call per key.
        """
        cache = self._cache
        plain = self._plain_codec
        encode = self._encode
        dumps = self._dumps
        key_bytes = orjson.dumps
        crc32 = zlib.crc32
        prefixes = self._prefixes
        maxp, lo, hi = self._maxp, self._kg_start, self._kg_end
        len2 = _LEN2
        deletes: list[bytes] = []
        add = (lambda _k: None) if changed is None else changed.add
        state: list[Any] = [None, None]  # key and entry being encoded, for the error message

        def items() -> Iterator[tuple[bytes, bytes]]:
            # A generator, not a list: a flush of 1M keys would otherwise allocate
            # (and page-fault in) ~150 MB of short-lived tuples.
            for key in self._dirty:
                entry = cache[key]
                state[0], state[1] = key, entry
                kb = key_bytes(key)
                kg = crc32(kb) % maxp
                if kg < lo or kg > hi:
                    raise ValueError("key group")
                db_key = prefixes[kg] + len2[len(kb)] + kb
                if len(db_key) > MAX_DB_KEY_BYTES:
                    raise ValueError("key size")
                raw = (None if entry is None else dumps(entry)) if plain else encode(entry)
                add(db_key)
                if raw is None:
                    deletes.append(db_key)
                else:
                    yield db_key, raw

        try:
            txn.cursor().putmulti(items())
        except lmdb.Error:
            raise
        except Exception as exc:
            self.db_key(state[0])  # raises the precise error when the key is at fault
            raise describe_encode_error(self.name, state[0], state[1], exc) from exc
        delete = txn.delete
        for db_key in deletes:
            delete(db_key)
        return len(self._dirty)

    def clear_dirty(self) -> None:
        """Forget dirty marks once the flush transaction has committed."""
        self._dirty.clear()

    def evict(self) -> None:
        """Drop the oldest half of the (clean) cache; the newest entry always survives."""
        cache = self._cache
        n = len(cache) - max(1, self._limit // 2)
        if n > 0:
            for key in list(islice(cache, n)):
                del cache[key]

    def live_keys(self, stored: dict[Any, bool]) -> list[Any]:
        """Merge keys found in LMDB (with liveness) with the cache."""
        cache = self._cache
        out = [
            k
            for k, live in stored.items()
            if (live if (e := cache.get(k, _MISS)) is _MISS else self.cached_live(e))
        ]
        out.extend(k for k, e in cache.items() if k not in stored and self.cached_live(e))
        return out


class _TtlMixin:
    """TTL for single-entry states: cache ``(value, ts)``, store ``ts | payload``."""

    __slots__ = ()

    if TYPE_CHECKING:
        _cache: dict[Any, Any]
        _dirty: set[Any]
        _now: Callable[[], float]
        _ttl: float
        _limit: int
        _host: StateHost
        _refresh_on_read: bool
        _loads: Callable[[bytes], Any]
        _dumps: Callable[[Any], bytes]

        def _miss(self, key: Any) -> Any: ...

    def _decode(self, raw: bytes) -> Any:
        return (self._loads(raw[TS_SIZE:]), unpack_ts(raw)[0])

    def _encode(self, entry: Any) -> bytes | None:
        if entry is None or self._now() - entry[1] >= self._ttl:
            return None
        return pack_ts(entry[1]) + self._dumps(entry[0])

    def store_live(self, raw: bytes) -> bool:
        return bool(self._now() - unpack_ts(raw)[0] < self._ttl)

    def cached_live(self, entry: Any) -> bool:
        return entry is not None and self._now() - entry[1] < self._ttl

    def _read(self, key: Any) -> Any:
        entry = self._cache.get(key, _MISS)
        if entry is _MISS:
            entry = self._miss(key)
        if entry is None:
            return None
        now = self._now()
        if now - entry[1] >= self._ttl:
            self._cache[key] = None
            self._dirty.add(key)
            return None
        if self._refresh_on_read:
            self._cache[key] = (entry[0], now)
            self._dirty.add(key)
        return entry[0]

    def _write(self, key: Any, value: Any) -> None:
        cache = self._cache
        cache[key] = None if value is None else (value, self._now())
        self._dirty.add(key)
        if len(cache) > self._limit:
            self._host.cache_full(self)  # type: ignore[arg-type]


class ValueStateImpl(KeyedStateBase):
    """One value per key; ``update(None)`` clears, ``value()`` of a cleared key is the default."""

    __slots__ = ("_default",)
    kind = "value"
    _plain_codec = True

    def __init__(self, descriptor: StateDescriptor, **kw: Any) -> None:
        super().__init__(descriptor, **kw)
        self._default = descriptor.default if isinstance(descriptor, ValueStateDescriptor) else None

    def value(self) -> Any:
        v = self._cache.get(self._ctx.key, _MISS)
        if v is _MISS:
            v = self._miss(self._ctx.key)
        if v is None:
            return self._default
        return v

    def update(self, value: Any) -> None:
        key = self._ctx.key
        cache = self._cache
        cache[key] = value
        self._dirty.add(key)
        if len(cache) > self._limit:
            self._host.cache_full(self)

    def clear(self) -> None:
        self._write(self._ctx.key, None)


class ReducingStateImpl(KeyedStateBase):
    """One value per key folded with ``reduce_fn``; the first ``add`` stores the value as is."""

    __slots__ = ("_reduce",)
    kind = "reducing"
    _plain_codec = True

    def __init__(self, descriptor: StateDescriptor, **kw: Any) -> None:
        super().__init__(descriptor, **kw)
        if not isinstance(descriptor, ReducingStateDescriptor):
            raise StateError(f"state {descriptor.name!r}: reducing state needs a reduce_fn")
        self._reduce = descriptor.reduce_fn

    def get(self) -> Any:
        v = self._cache.get(self._ctx.key, _MISS)
        if v is _MISS:
            v = self._miss(self._ctx.key)
        return v

    def add(self, value: Any) -> None:
        key = self._ctx.key
        cache = self._cache
        cur = cache.get(key, _MISS)
        if cur is _MISS:
            cur = self._miss(key)
        cache[key] = value if cur is None else self._reduce(cur, value)
        self._dirty.add(key)
        if len(cache) > self._limit:
            self._host.cache_full(self)

    def clear(self) -> None:
        self._write(self._ctx.key, None)


class ListStateImpl(KeyedStateBase):
    """A list per key, stored as one LMDB value; an empty list is no entry at all."""

    __slots__ = ()
    kind = "list"

    def _encode(self, entry: Any) -> bytes | None:
        return self._dumps(entry) if entry else None

    def cached_live(self, entry: Any) -> bool:
        return bool(entry)

    def get(self) -> list[Any]:
        cur = self._read(self._ctx.key)
        return list(cur) if cur else []

    def add(self, value: Any) -> None:
        key = self._ctx.key
        cur = self._read(key)
        if cur is None:
            cur = []
        cur.append(value)
        self._write(key, cur)

    def add_all(self, values: Sequence[Any]) -> None:
        if not values:
            return
        key = self._ctx.key
        cur = self._read(key)
        cur = list(values) if cur is None else [*cur, *values]
        self._write(key, cur)

    def update(self, values: Sequence[Any]) -> None:
        self._write(self._ctx.key, list(values) if values else None)

    def clear(self) -> None:
        self._write(self._ctx.key, None)


class TtlValueState(_TtlMixin, ValueStateImpl):
    __slots__ = ()
    _plain_codec = False

    def value(self) -> Any:
        v = self._read(self._ctx.key)
        return self._default if v is None else v

    def update(self, value: Any) -> None:
        self._write(self._ctx.key, value)


class TtlReducingState(_TtlMixin, ReducingStateImpl):
    __slots__ = ()
    _plain_codec = False

    def get(self) -> Any:
        return self._read(self._ctx.key)

    def add(self, value: Any) -> None:
        key = self._ctx.key
        cur = self._read(key)
        self._write(key, value if cur is None else self._reduce(cur, value))


class TtlListState(_TtlMixin, ListStateImpl):
    """List state whose whole list expires ``ttl`` after its last write (not per element)."""

    __slots__ = ()

    def _encode(self, entry: Any) -> bytes | None:
        if entry is None or not entry[0]:
            return None
        return _TtlMixin._encode(self, entry)

    def cached_live(self, entry: Any) -> bool:
        return _TtlMixin.cached_live(self, entry) and bool(entry[0])
