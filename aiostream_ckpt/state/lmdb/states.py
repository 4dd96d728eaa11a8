"""Value, list, map and reducing state with a write-behind cache in front of LMDB.

The hot path is plain dict operations. Each state keeps two dicts:

* ``_cache``: key -> newest entry, the only structure reads look at (a miss
  goes to LMDB; negative results are cached too, as ``None``);
* ``_dirty``: key -> entry *captured at write time*, the write set of the
  current epoch (the time since the last checkpoint barrier).

At the barrier the backend *freezes* every state's write set with
:meth:`KeyedStateBase.freeze`, an O(1) swap for an empty dict, so the
synchronous part of a snapshot does not depend on the number of dirty keys. A
frozen write set is never mutated again; the backend later encodes it into
LMDB with :meth:`KeyedStateBase.apply`, slice by slice on the event loop.
Until then ``_cache`` still holds the newest entry of every key in it (eviction
first applies every write set), so a read never needs to look into the frozen
sets and a cache miss can never see an LMDB value older than a pending write.

Contract for mutable values (why: a frozen write set is encoded after the
barrier, while processing goes on):

* ``update()`` / ``add()`` of value and reducing state and ``put()`` of map
  state capture the value when called, through the state's codec
  (:mod:`~aiostream_ckpt.state.codecs`), which first refuses a value that
  would not read back the same after a restore (:class:`StateTypeError`,
  raised from the call that stored it). ``int``, ``str``, ``bool`` and
  ``None`` (and finite floats; with pickle also bytes and tuples/frozensets)
  are kept by reference (they cannot change); any other value is encoded
  right away, so mutating it in place afterwards (or mutating the object
  ``value()`` returned) never leaks into a snapshot: a snapshot holds each
  value as of its last ``update()`` before the barrier. The price is one
  encode per update of a mutable value (~0.3 us for a small dict); int/str
  updates of an untyped state pay only the type test. A typed state encodes
  and decodes every value it is given (the check), so it never holds one by
  reference.
* As in Flink, a value returned by ``value()``/``get()`` is the cached object:
  mutate it and call ``update()``, or the change may be lost (and it is visible
  to reads until the key is evicted, so do not rely on that either).
* List state owns its lists: ``get()`` returns a copy and ``add()`` copies a
  list that a frozen write set holds before appending. The *elements* are kept
  by reference, as in Flink's heap backend: do not mutate an object after
  passing it to ``add()``/``add_all()``/``update()``.

As in Flink, storing ``None`` in a value/reducing state clears it. TTL'd states
cache ``(value, ts)`` pairs and store ``ts (f64 BE) | payload``; they live in
subclasses so that states without TTL pay nothing for it.

Threading: every method runs on the event loop, :meth:`KeyedStateBase.apply`
too (py-lmdb releases the GIL around every put, so puts made in a worker
thread while the loop is busy wait for the GIL once per key; see
:mod:`~aiostream_ckpt.state.lmdb.backend`). ``apply`` only reads the frozen
write set and immutable configuration, so it may be interleaved with
processing between its slices.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

import lmdb
import orjson

from aiostream_ckpt.errors import StateError, StateMigrationError
from aiostream_ckpt.state.backend import KeyContext
from aiostream_ckpt.state.codecs import (
    EXACT_SCALARS,
    UNTYPED,
    UNTYPED_KEYS,
    StreamKeyCodec,
    value_codec,
)
from aiostream_ckpt.state.descriptors import (
    ReducingStateDescriptor,
    StateDescriptor,
    TtlUpdateType,
    ValueStateDescriptor,
)
from aiostream_ckpt.state.keygroups import KeyGroupRange
from aiostream_ckpt.state.lmdb.snapshot import ChangeLog, Put, Record
from aiostream_ckpt.state.serde import (
    MAX_DB_KEY_BYTES,
    TS_SIZE,
    describe_encode_error,
    pack_ts,
    state_prefixes,
    unpack_ts,
)

_LEN2 = [n.to_bytes(2, "big") for n in range(MAX_DB_KEY_BYTES + 1)]
#: ``b"%d" % v`` of small ints, shared by every record that stores one (counts mostly are).
_SMALL_INTS = [b"%d" % v for v in range(4096)]
_MISS: Any = object()  # not in the cache: ask LMDB
#: Cache misses in one batch from which a value state reads with ``.get()``, and below
#: which it goes back to subscripts (see ``ValueStateImpl.after_batch``).
_MISSES_COLD, _MISSES_WARM = 128, 32
_DELETED: Any = object()  # a map entry known to be absent
#: A write set is put bucketed by key group from this many keys per group (see ``apply``).
_BUCKETS_FROM = 4
#: Keys whose LMDB key one state remembers between encodes (see ``KeyedStateBase.encode``).
_KEY_MEMO_MAX = 1 << 15

#: Types an untyped (or pickle) state holds by reference without asking its codec:
#: ``value.__class__ in _EXACT`` is the whole check of an int update.
_EXACT = EXACT_SCALARS


class StateHost(Protocol):
    """What a state needs from its backend."""

    def read_txn(self) -> lmdb.Transaction[bytes]:
        """Return a read transaction (any committed view; see the module docstring)."""
        ...

    def cache_full(self, state: KeyedStateBase) -> None:
        """Write every pending write set to LMDB, then let ``state`` evict."""
        ...


class KeyedStateBase:
    """Cache, write set and LMDB key building shared by every state kind."""

    __slots__ = (
        "_cache",
        "_codec",
        "_ctx",
        "_dirty",
        "_dumps",
        "_host",
        "_key_memo",
        "_kg_end",
        "_kg_start",
        "_limit",
        "_loads",
        "_maxp",
        "_now",
        "_plain_int",
        "_plain_str",
        "_prefixes",
        "_refresh_on_read",
        "_stream_keys",
        "_ttl",
        "_where",
        "descriptor",
        "name",
    )

    kind: ClassVar[str] = ""
    #: True when a write-set entry is the (captured) user value and None means
    #: "delete" (no TTL, not a list): lets ``apply`` skip a method call per key.
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
        stream_keys: StreamKeyCodec = UNTYPED_KEYS,
    ) -> None:
        self.descriptor = descriptor
        self._stream_keys = stream_keys
        #: key classes no write needs to check (a read checks its key at the miss):
        #: exact str and int keys when untyped; none when typed (a class no key has)
        self._plain_str = stream_keys.plain_str
        self._plain_int = stream_keys.plain_int
        self.name = descriptor.name
        self._where = f"state {descriptor.name!r}"  # names the state in a key's refusal
        self._host = host
        self._ctx = key_context
        self._cache: dict[Any, Any] = {}
        self._dirty: Any = {}
        self._limit = 1_000_000
        self._maxp = max_parallelism
        self._kg_start = key_group_range.start
        self._kg_end = key_group_range.end
        self._prefixes = state_prefixes(descriptor.name, max_parallelism)
        #: str/int key -> (LMDB key, key group), of keys encoded before (see ``encode``)
        self._key_memo: dict[Any, tuple[bytes, int]] = {}
        stored_type, one_type = descriptor.value_types()
        codec = self._codec = value_codec(
            descriptor.serializer, stored_type, check_type=one_type, state=descriptor.name
        )
        self._dumps, self._loads = codec.dumps, codec.loads
        self._now = now
        ttl = descriptor.ttl
        self._ttl = ttl.ttl if ttl is not None else 0.0
        self._refresh_on_read = ttl is not None and (
            ttl.update_type is TtlUpdateType.ON_READ_AND_WRITE
        )

    # -- keys -------------------------------------------------------------
    def db_key(self, key: Any) -> bytes:
        """LMDB key of ``key`` in this state; refuses keys outside this instance's range."""
        kb = self._stream_keys.dumps(key, self._where)
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

    def _dump(self, value: Any) -> bytes:
        """Bytes of a captured value (an encoded one is a bytearray: stored as is)."""
        if value.__class__ is bytearray:
            return cast(bytes, value)
        return self._dumps(value)

    def _encode(self, entry: Any) -> bytes | None:
        """Bytes to store for a write-set entry, or None to delete it."""
        return None if entry is None else self._dump(entry)

    def _capture(self, value: Any) -> Any:
        """Return the write-set entry of ``value``; raise StateTypeError for a misfit."""
        return self._codec.capture(value, self.name)

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

    def _check_unread(self, key: Any) -> None:
        """Refuse a stream key written before it is read, unless it reads back the same.

        Why: a read checks its key where it misses the cache (:meth:`db_key`);
        a ``ValueState.update`` without a read stored a ``StrEnum`` or ``str``
        subclass key, which came back as ``str`` after a restore (in timers,
        ``ctx.current_key``). A key in the cache was checked when it got there.
        """
        cls = key.__class__
        if cls is not self._plain_str and cls is not self._plain_int and key not in self._cache:
            self.db_key(key)

    def _write(self, key: Any, value: Any) -> None:
        self._check_unread(key)
        entry = self._capture(value)  # first: a refused value changes nothing
        cache = self._cache
        cache[key] = value
        self._dirty[key] = entry
        if len(cache) > self._limit:
            self._host.cache_full(self)

    # -- backend side ----------------------------------------------------------
    def set_cache_limit(self, limit: int) -> None:
        self._limit = max(2, limit)

    def cache_size(self) -> int:
        return len(self._cache)

    def cached_entries(self) -> int:
        """Entries the cache holds (map state: map entries and markers of every key)."""
        return len(self._cache)

    def over_limit(self) -> bool:
        return len(self._cache) > self._limit

    def after_batch(self) -> None:
        """Adapt to the batch just processed (see ``ValueStateImpl.after_batch``)."""

    def has_dirty(self) -> bool:
        return bool(self._dirty)

    def freeze(self) -> Any:
        """Hand over the current write set (None if empty) and start a new one: O(1)."""
        dirty = self._dirty
        if not dirty:
            return None
        self._dirty = {}
        return dirty

    def needs_view(self, frozen: Any) -> bool:
        """Whether encoding ``frozen`` reads LMDB (then every earlier write is applied first)."""
        return False

    def encode(
        self,
        frozen: Any,
        log: ChangeLog,
        slice_keys: int,
        view: Callable[[], lmdb.Transaction[bytes]],
    ) -> Iterator[int]:
        """Turn a frozen write set into LMDB records, ``slice_keys`` keys at a time.

        A generator: it yields the keys done after every slice, so that the
        backend can give the event loop back between slices, and adds the
        records to ``log`` when it is done (each list all puts or all deletes,
        in the order they must be written); abandoned half way, it has logged
        nothing. ``view`` gives the committed LMDB view (unused here). This is
        the per-key cost a snapshot waits for, hence the inlined key building
        and the int fast path. A big write set is bucketed by key group while
        it is encoded (one index per key), so that it is written in key-group
        order: in a 1 M key store, 300 k puts took 0.18 s so against 0.27 s
        in dict order; a full sort costs as much as it saves (0.12 s + 0.12 s)
        and is one call that cannot be sliced.

        The LMDB key and key group of an exact ``str``/``int`` key are
        remembered (``_key_memo``, up to :data:`_KEY_MEMO_MAX` keys, cleared
        when full) for the next encode: a key-by workload writes the same keys
        at every barrier, and building one (orjson, crc32, two concatenations)
        was about half of an encode. They depend on nothing but the key and this
        state's fixed name, max parallelism and key-group range (a restore or a
        rescale makes new states), so they cannot go stale. Not a ``bool``,
        ``float`` or tuple key: ``True == 1`` in a dict, but it is stored as
        ``true``. A write set bigger than the memo skips it (it would only churn
        it). ~150 B a key remembered, so at most ~5 MB a state. 10 k session
        keys (``python -m bench.encode_cost``): 6,700 -> 3,700 instructions a
        key (callgrind), 820 -> 500 ns; above the memo's size +100 instructions
        (+2 %). In a job the gain is smaller: the values and keys of a write
        set are cold in the CPU cache by the barrier, and the memo adds reads
        of its own (its key, its entry); see the commit for the harness figures.

        The records are kept (the change log is the next delta's content).
        Values are the codec's ``bytes`` as they come (no more copied): msgspec
        and pickle give right-sized results, which pymalloc may keep in a block
        up to a third bigger (RSS of 1 M kept 33-byte values: 104 B a record
        against 88 B copied), for as long as the epoch's log lives; the copy
        cost ~600 instructions a key. (The copy was for orjson, whose result
        held a ~4 KB buffer.)
        """
        plain = self._plain_codec
        encode = self._encode
        dumps = self._dumps
        fast_int = self._codec.ints_as_text  # ints: the codec's own bytes, no buffer
        key_bytes = orjson.dumps
        crc32 = zlib.crc32
        prefixes = self._prefixes
        maxp, lo, hi = self._maxp, self._kg_start, self._kg_end
        len2 = _LEN2
        small_ints, n_small = _SMALL_INTS, len(_SMALL_INTS)
        max_kb = MAX_DB_KEY_BYTES - len(prefixes[0]) - 2  # longer keys make too long LMDB keys
        memo = self._key_memo
        if len(memo) >= _KEY_MEMO_MAX:
            memo.clear()  # full of keys of earlier encodes: make room for today's
        # only a write set that fits: a bigger one would only churn the memo
        use_memo = len(frozen) <= _KEY_MEMO_MAX
        remembered = memo.get
        groups = hi - lo + 1
        # a bucket per key group for a big write set, else one list for every group
        big = len(frozen) >= _BUCKETS_FROM * groups
        puts: list[list[Put]] = [[] for _ in range(groups)] if big else [[]]
        # indexed by key group; out-of-range groups are refused before they are used
        add = [puts[0].append] * lo + [b.append for b in puts] * (groups // len(puts))
        deletes: list[Record] = []
        items = iter(frozen.items())
        while chunk := list(islice(items, slice_keys)):
            key: Any = None
            entry: Any = None
            try:
                for key, entry in chunk:
                    # exact str/int keys only: a bool or float key may equal an int one
                    # but is stored as other bytes
                    if (
                        use_memo
                        and ((cls := key.__class__) is str or cls is int)
                        and (hit := remembered(key))
                    ):
                        db_key, kg = hit
                    else:
                        kb = key_bytes(key)
                        kg = crc32(kb) % maxp
                        n = len(kb)
                        if kg < lo or kg > hi or n > max_kb:
                            raise ValueError("key")
                        db_key = prefixes[kg] + len2[n] + kb
                        if use_memo and (cls is str or cls is int) and len(memo) < _KEY_MEMO_MAX:
                            memo[key] = (db_key, kg)
                    raw: bytes | bytearray | None
                    if not plain:
                        raw = encode(entry)
                    else:
                        cls = entry.__class__
                        if cls is int and fast_int:
                            if 0 <= entry < n_small:
                                add[kg]((db_key, small_ints[entry]))
                            else:
                                add[kg]((db_key, b"%d" % entry))
                            continue
                        if entry is None:
                            raw = None
                        elif cls is bytearray:
                            raw = entry
                        else:
                            raw = dumps(entry)
                    if raw is None:
                        deletes.append((db_key, None))
                    else:
                        add[kg]((db_key, raw))
            except Exception as exc:
                self.db_key(key)  # raises the precise error when the key is at fault
                raise describe_encode_error(self.name, key, entry, exc) from exc
            yield len(chunk)
        log.add(self.name, *puts, deletes)

    def evict(self) -> None:
        """Drop the oldest half of the cache; the newest entry always survives.

        Only called right after every write set was applied, so all entries are clean.
        """
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


#: The cache entry of an expired stored value that would not decode (see TtlCodec._decode).
_EXPIRED = (None, float("-inf"))


class TtlCodec:
    """A TTL entry: cached as ``(value, ts)``, stored as ``ts | payload``.

    One codec for the single-entry TTL states and the map state's entries;
    ``_ABSENT`` is the cache's marker for "no entry" in each.
    """

    __slots__ = ()
    _ABSENT: Any = None

    if TYPE_CHECKING:
        _now: Callable[[], float]
        _ttl: float
        _loads: Callable[[bytes], Any]

        def _dump(self, value: Any) -> bytes: ...

    def _decode(self, raw: bytes) -> Any:
        """Return the cache entry of stored bytes.

        An expired value that no longer fits the declared type (a field since
        made required, an enum member since removed: a restore's scan skips
        expired values) becomes an entry that never turns live, whatever the
        clock does, and that the read finding it deletes: no read returns an
        expired value, so none may fail on one. The clock is read only then
        (a decode is ~1 us; reading it first cost ~+25 %).
        """
        try:
            return (self._loads(raw[TS_SIZE:]), unpack_ts(raw)[0])
        except StateMigrationError:
            if self._now() - unpack_ts(raw)[0] < self._ttl:
                raise
            return _EXPIRED

    def _encode_ttl(self, entry: Any) -> bytes | None:
        if entry is self._ABSENT or self._now() - entry[1] >= self._ttl:
            return None
        return pack_ts(entry[1]) + self._dump(entry[0])

    def store_live(self, raw: bytes) -> bool:
        return bool(self._now() - unpack_ts(raw)[0] < self._ttl)


class _TtlMixin(TtlCodec):
    """TTL for single-entry states: cache ``(value, ts)``, store ``ts | payload``."""

    __slots__ = ()

    if TYPE_CHECKING:
        _cache: dict[Any, Any]
        _dirty: dict[Any, Any]
        _now: Callable[[], float]
        _ttl: float
        _limit: int
        _host: StateHost
        _refresh_on_read: bool
        _loads: Callable[[bytes], Any]
        _dumps: Callable[[Any], bytes]
        name: str

        def _miss(self, key: Any) -> Any: ...
        def _dump(self, value: Any) -> bytes: ...
        def _capture(self, value: Any) -> Any: ...
        def _check_unread(self, key: Any) -> None: ...

    _encode = TtlCodec._encode_ttl

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
            self._dirty[key] = None
            return None
        if self._refresh_on_read:
            return self._touch(key, entry[0], now)
        return entry[0]

    def _touch(self, key: Any, value: Any, now: float) -> Any:
        """Restart ``key``'s clock on read; return the value the caller should use."""
        self._cache[key] = (value, now)
        self._dirty[key] = (self._capture(value), now)
        return value

    def _write(self, key: Any, value: Any) -> None:
        self._check_unread(key)
        cache = self._cache
        if value is None:
            cache[key] = self._dirty[key] = None
        else:
            entry = self._capture(value)  # first: a refused value changes nothing
            now = self._now()
            cache[key] = (value, now)
            self._dirty[key] = (entry, now)
        if len(cache) > self._limit:
            self._host.cache_full(self)  # type: ignore[arg-type]


class ValueStateImpl(KeyedStateBase):
    """One value per key; ``update(None)`` clears, ``value()`` of a cleared key is the default.

    ``update()`` captures its value (see the module docstring): immutable
    values by reference, others encoded at once, so later in-place mutation
    cannot leak into a snapshot.

    Reads take one of two paths, picked per batch by :meth:`after_batch` from
    the last batch's cache misses: a subscript (this class) when keys are
    cached, ``dict.get`` (:class:`_MissingValueState`) when many are not.
    """

    __slots__ = ("_default", "_misses")
    kind = "value"
    _plain_codec = True

    def __init__(self, descriptor: StateDescriptor, **kw: Any) -> None:
        super().__init__(descriptor, **kw)
        self._default = descriptor.default if isinstance(descriptor, ValueStateDescriptor) else None
        self._misses = 0

    def value(self) -> Any:
        try:  # when it hits, a subscript is ~14 ns cheaper than .get()
            v = self._cache[self._ctx.key]
        except KeyError:  # ... and a miss ~140 ns dearer (the KeyError)
            self._misses += 1
            v = self._miss(self._ctx.key)
        if v is None:
            return self._default
        return v

    def after_batch(self) -> None:
        """Switch to the ``.get()`` reads once a batch missed the cache often.

        Swapping ``__class__`` between two classes of one layout keeps
        ``value()`` a plain method (no flag test per read). ``.get()`` alone
        cost 1 k keys (all hits) 2.8 % (1.25 s vs 1.285 s of CPU for 1 M
        pv_count events); subscripts alone cost 1 M new keys (all misses) 3 %
        (4.48 s vs 4.35 s with this switch, medians of 4; 1 k and 100 k keys:
        no change). ``.get()`` pays off from ~9 % misses; :data:`_MISSES_COLD`
        per batch is 6 % of 2048 reads.
        """
        misses, self._misses = self._misses, 0
        cls = self.__class__  # TTL subclasses keep theirs
        if misses >= _MISSES_COLD and cls is ValueStateImpl:
            self.__class__ = _MissingValueState
        elif misses < _MISSES_WARM and cls is _MissingValueState:
            self.__class__ = ValueStateImpl

    def update(self, value: Any) -> None:
        # The hot path: no cache-size check here (the keyed operator trims the caches
        # after every batch, see ``LmdbStateBackend.after_batch``), and the inlined type
        # test keeps int/str updates within a few ns of two dict stores. Anything
        # else goes through the codec, which refuses what would not read back the
        # same (before the cache changes). Typed states: :class:`TypedValueState`.
        key = self._ctx.key
        if (
            (cls := key.__class__) is not self._plain_str
            and cls is not self._plain_int
            and key not in self._cache
        ):
            self.db_key(key)  # see _check_unread, inlined: ~130 instructions a str key
        self._dirty[key] = value if value.__class__ in _EXACT else self._capture(value)
        self._cache[key] = value

    def update_unchanged(self, value: Any) -> None:
        """``update(value)`` for a value that is never changed after this call.

        For engine operators whose values are built of immutable parts the
        codec gives back exactly (session windows: tuples of ints and scalar
        contents): the write set holds it by reference, like an int, and the
        snapshot encodes it. Why: ``update()`` of a list encodes it at once
        (a typed state also decodes and compares it), per key and batch,
        where a snapshot encodes each changed key once.
        """
        key = self._ctx.key
        self._dirty[key] = value
        self._cache[key] = value

    def update_all_unchanged(self, values: dict[Any, Any]) -> None:
        """``update_unchanged`` of each ``key: value`` of ``values`` (None clears the key).

        The key context is not used (nor changed). Why: the session window
        operator writes every key it held at each barrier (10 k keys per barrier
        on the bench's input); a key switch and a call per key cost 10x the two
        dict updates here.
        """
        self._dirty.update(values)
        self._cache.update(values)

    def clear(self) -> None:
        self._write(self._ctx.key, None)


class _MissingValueState(ValueStateImpl):
    """:class:`ValueStateImpl` while most reads miss the cache: no KeyError per miss."""

    __slots__ = ()

    def value(self) -> Any:
        v = self._cache.get(self._ctx.key, _MISS)
        if v is _MISS:
            self._misses += 1
            v = self._miss(self._ctx.key)
        if v is None:
            return self._default
        return v


class ReducingStateImpl(KeyedStateBase):
    """One value per key folded with ``reduce_fn``; the first ``add`` stores the value as is.

    The folded value is captured like ``ValueState.update``'s, so a
    ``reduce_fn`` that mutates its accumulator in place is safe.
    """

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
        new = value if cur is None else self._reduce(cur, value)
        self._dirty[key] = new if new.__class__ in _EXACT else self._capture(new)
        cache[key] = new
        if len(cache) > self._limit:
            self._host.cache_full(self)

    def clear(self) -> None:
        self._write(self._ctx.key, None)


class ListStateImpl(KeyedStateBase):
    """A list per key, stored as one LMDB value; an empty list is no entry at all.

    The state owns its lists, copy-on-write per epoch: ``add()`` appends in
    place only to a list the current write set holds, and copies one a frozen
    write set may hold. Elements are kept by reference: do not mutate an
    object after adding it.
    """

    __slots__ = ()
    kind = "list"

    def _encode(self, entry: Any) -> bytes | None:
        return self._dumps(entry) if entry else None

    def _capture(self, value: Any) -> Any:
        return value  # a list the state owns; never mutated once frozen

    def cached_live(self, entry: Any) -> bool:
        return bool(entry)

    def _owned(self, key: Any, cur: list[Any]) -> bool:
        """Whether ``cur`` belongs to the current write set (so no snapshot holds it)."""
        return self._dirty.get(key) is cur

    def get(self) -> list[Any]:
        cur = self._read(self._ctx.key)
        return list(cur) if cur else []

    def _check(self, values: Sequence[Any]) -> None:
        """Refuse elements that would not read back the same (they are encoded later)."""
        codec, name = self._codec, self.name
        untyped = codec is UNTYPED
        for value in values:
            if not (untyped and value.__class__ in _EXACT):
                codec.check(value, name)

    def add(self, value: Any) -> None:
        self._check((value,))
        key = self._ctx.key
        cur = self._read(key)
        if cur is None:
            cur = [value]
        elif self._owned(key, cur):
            cur.append(value)
        else:
            cur = [*cur, value]
        self._write(key, cur)

    def add_all(self, values: Sequence[Any]) -> None:
        if not values:
            return
        self._check(values)
        key = self._ctx.key
        cur = self._read(key)
        cur = list(values) if cur is None else [*cur, *values]
        self._write(key, cur)

    def update(self, values: Sequence[Any]) -> None:
        self._check(values)
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

    def update_unchanged(self, value: Any) -> None:
        self._write(self._ctx.key, value)  # a TTL entry is (value, ts): no shortcut

    def update_all_unchanged(self, values: dict[Any, Any]) -> None:
        for key, value in values.items():
            self._write(key, value)


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

    def _dump(self, value: Any) -> bytes:
        return self._dumps(value)

    def _owned(self, key: Any, cur: list[Any]) -> bool:
        entry = self._dirty.get(key)
        return entry is not None and entry[0] is cur

    def _touch(self, key: Any, value: Any, now: float) -> Any:
        if not self._owned(key, value):
            value = list(value)  # a frozen write set may hold it: the new epoch gets a copy
        self._cache[key] = self._dirty[key] = (value, now)
        return value

    def cached_live(self, entry: Any) -> bool:
        return _TtlMixin.cached_live(self, entry) and bool(entry[0])


class TypedValueState(ValueStateImpl):
    """Value state with a declared type: every update goes through the typed codec's check."""

    __slots__ = ()

    def update(self, value: Any) -> None:
        key = self._ctx.key
        self._check_unread(key)
        self._dirty[key] = self._capture(value)
        self._cache[key] = value


class TypedReducingState(ReducingStateImpl):
    """Reducing state with a declared type: every folded value is checked."""

    __slots__ = ()

    def add(self, value: Any) -> None:
        key = self._ctx.key
        cur = self.get()
        self._write(key, value if cur is None else self._reduce(cur, value))
