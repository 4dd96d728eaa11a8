"""The LMDB keyed state backend: one working LMDB environment per operator instance.

The pieces: the states and their write-behind caches
(:mod:`~aiostream_ckpt.state.lmdb.states`), the queue that brings their frozen
write sets into LMDB (:mod:`~aiostream_ckpt.state.lmdb.writes`), the snapshot
strategy (:mod:`~aiostream_ckpt.state.lmdb.strategy`, the four steps of a
snapshot), the snapshot files (:mod:`~aiostream_ckpt.state.lmdb.snapshot`),
restore (:mod:`~aiostream_ckpt.state.lmdb.restore`) and what a handle records
of each state (:mod:`~aiostream_ckpt.state.lmdb.describe`). The backend wires
them and owns the working environment.

Threading: every LMDB write happens on the event loop thread (the one
exception, :meth:`~LmdbStateBackend.restore`, runs before any state exists).
Why: py-lmdb releases the GIL around every single put (also inside
``Cursor.putmulti``), and a thread that gives the GIL up and takes it back a
million times waits for it each time behind a busy event loop (up to the 5 ms
switch interval): measured, 300 k puts took 0.03 s on an idle interpreter and
6-10 s in a worker thread beside a busy one. On the loop they run at full
speed, in slices of ``apply_slice_keys``, yielding to processing between
slices; so does the rest of the per-key Python work (encoding, packing),
which in a thread would get only the GIL's leftovers. A write set being
applied stays open in one write transaction across slices (committing per
slice would rewrite the same pages many times). Only the loop touches the
queue and the open transaction, so no lock is needed. The worker thread
touches only its pinned read transaction (py-lmdb opens environments with
``MDB_NOTLS``, so a read transaction may move between threads) and the files
it writes: ``Environment.copyfd``, file writes, hashing and fsync keep the GIL
released for long stretches. Reads on the event loop use their own read
transaction, renewed after every commit so that it does not hold old pages;
any committed view is correct for them, because the caches hold the newest
entry of every key with an unapplied write (see
:mod:`~aiostream_ckpt.state.lmdb.states`). :meth:`~LmdbStateBackend.close`
waits for running snapshot threads, because closing the environment under a
running copy would free mapped memory.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import lmdb

from aiostream_ckpt.clock import Clock, SystemClock
from aiostream_ckpt.errors import StateError
from aiostream_ckpt.state.backend import (
    AsyncSnapshotPart,
    KeyContext,
    SnapshotTarget,
    StateHandle,
)
from aiostream_ckpt.state.codecs import UNTYPED_KEYS, StreamKeyCodec, json_encoder
from aiostream_ckpt.state.descriptors import StateDescriptor
from aiostream_ckpt.state.evolution import cleared, merge_classes
from aiostream_ckpt.state.key_evolution import (
    check_key_change,
    check_stored_keys,
    described_keys,
    keys_unrecorded,
    lost_members,
)
from aiostream_ckpt.state.keygroups import KeyGroupRange
from aiostream_ckpt.state.lmdb import restore as restore_mod
from aiostream_ckpt.state.lmdb.describe import check_migration, describe, misfit, state_class
from aiostream_ckpt.state.lmdb.environment import open_env, safe_name
from aiostream_ckpt.state.lmdb.snapshot import ChangeTracker
from aiostream_ckpt.state.lmdb.states import KeyedStateBase
from aiostream_ckpt.state.lmdb.strategy import SnapshotStrategy
from aiostream_ckpt.state.lmdb.writes import WriteQueue
from aiostream_ckpt.state.serde import key_group_bytes, name_part

#: Work per slice on the event loop before it yields: keys encoded, records packed
#: or written; ~0.3-0.7 us each, so ~20-40 ms. Bigger slices finish a checkpoint
#: sooner (its output commits then); 1 M keys, measured: p99 480 ms against 510-560
#: ms with half of it.
APPLY_SLICE_KEYS = 65536


class LmdbStateBackend:
    """Keyed state of one operator instance in LMDB, behind a write-behind dict cache.

    ``full_checkpoint_every=N`` bounds the incremental chain to one full
    snapshot (a full file, and its tail delta if it has one) and ``N-1``
    deltas (1 means every snapshot is full). ``allow_pickle`` lets a json
    descriptor open a state that was snapshotted with pickle by converting it
    (which unpickles); without it that is a :class:`StateMigrationError`.
    ``apply_slice_keys``: how much work (keys encoded, records packed or
    written) the asynchronous part does on the event loop before it yields.
    """

    def __init__(
        self,
        *,
        operator_uid: str,
        subtask_index: int,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        local_dir: Path,
        clock: Clock | None = None,
        cache_max_entries: int = 1_000_000,
        full_checkpoint_every: int = 10,
        allow_pickle: bool = False,
        apply_slice_keys: int = APPLY_SLICE_KEYS,
        max_delta_ratio: float = 0.5,
        key_type: Any = None,
    ) -> None:
        if full_checkpoint_every < 1:
            raise StateError("full_checkpoint_every must be >= 1")
        if max_delta_ratio < 0:
            raise StateError("max_delta_ratio must be >= 0")
        if apply_slice_keys < 1:
            raise StateError("apply_slice_keys must be >= 1")
        if not 0 <= key_group_range.start <= key_group_range.end < max_parallelism:
            raise StateError(f"key group range {key_group_range} outside [0, {max_parallelism})")
        self.operator_uid = operator_uid
        self.subtask_index = subtask_index
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.key_context = KeyContext()
        #: ``key_by(..., key_type=)``: how keys are checked and read back (``keys()``, timers)
        self._stream_keys = UNTYPED_KEYS if key_type is None else StreamKeyCodec(key_type)
        #: what a restore compares its ``key_type`` with (see :func:`check_key_change`)
        self._keys_record = described_keys(key_type)
        self._clock: Clock = clock or SystemClock()
        #: entries the state caches may hold in all (``state.cache_max_entries``)
        self.cache_max_entries = cache_max_entries
        self._allow_pickle = allow_pickle
        self._token = uuid.uuid4().hex[:8]
        self._file_stem = f"{safe_name(operator_uid)}-{subtask_index}"
        self._dir = Path(local_dir) / f"lmdb-{self._file_stem}-{self._token}"
        self._dir.mkdir(parents=True)
        self._env = open_env(self._dir)
        self._rtxn: lmdb.Transaction[bytes] | None = None
        self._states: dict[str, KeyedStateBase] = {}
        self._meta: dict[str, dict[str, Any]] = {}  # per-state kind/serializer/ttl, incl. restored
        self._restored = False
        self._tracker = ChangeTracker(full_checkpoint_every, max_delta_ratio)
        self._writes = WriteQueue(
            lambda: self._env, self.read_txn, apply_slice_keys, on_commit=self._drop_rtxn
        )
        self._snapshots = SnapshotStrategy(
            env=lambda: self._env,
            writes=self._writes,
            tracker=self._tracker,
            handle_fields={
                "operator_uid": operator_uid,
                "subtask_index": subtask_index,
                "key_group_range": key_group_range.to_json(),
                "max_parallelism": max_parallelism,
                "keys": self._keys_record,
            },
            file_stem=self._file_stem,
            token=self._token,
            owner=f"{self._file_stem}-{self._token}",
        )
        self._closed = False
        self.last_flush_entries = 0

    # -- StateHost ---------------------------------------------------------------
    def read_txn(self) -> lmdb.Transaction[bytes]:
        """Return the loop's read view, begun on first use after the last commit.

        Every commit ends it (``on_commit``), not the next read: a view left
        open keeps every page freed after it from being reused, and with all
        keys cached no read comes to renew it, so each checkpoint's write
        transaction appended fresh pages (pv_count, 10 k keys, 1 s
        checkpoints: +0.6 MB/s for ~1 MB of live state).
        """
        txn = self._rtxn
        if txn is None:
            txn = self._rtxn = self._env.begin(buffers=False)
        return txn

    def cache_full(self, state: KeyedStateBase) -> None:
        self.flush()
        state.evict()

    def after_batch(self) -> None:
        """Evict from every state whose cache outgrew its limit; let states adapt.

        The keyed operator calls this after every batch and timer firing
        (``StreamOperator.end_batch``), so the hottest write
        (``ValueState.update``) needs no size check of its own; a cache may
        exceed its limit by the keys one batch touches.
        """
        for state in self._states.values():
            if state.over_limit():
                self.cache_full(state)
            state.after_batch()

    def check_key(self, key: Any, where: str) -> None:
        """Refuse a stream key as the states do at its first access (see the protocol)."""
        self._stream_keys.check_new(key, where)

    # -- states ------------------------------------------------------------------------
    def create_state(self, descriptor: StateDescriptor) -> Any:
        self._check_open()
        existing = self._states.get(descriptor.name)
        if existing is not None:
            if existing.descriptor == descriptor:  # asked again (per record, in some apps)
                return existing
            if describe(existing.descriptor) != describe(descriptor):
                raise StateError(
                    f"state {descriptor.name!r} was already created as "
                    f"{describe(existing.descriptor)}, now requested as "
                    f"{describe(descriptor)}"
                )
            return existing
        cls = state_class(descriptor)
        wanted = describe(descriptor)
        old = self._meta.get(descriptor.name)
        if old is not None and old != wanted:
            scanned = check_migration(
                descriptor,
                old,
                wanted,
                allow_pickle=self._allow_pickle,
                misfit=lambda: self._misfit(descriptor),
                convert=lambda: self._convert_pickle(descriptor, old["ttl"]),
            )
            if old.get("classes") and wanted["serializer"] == "json":
                # fields lost since stay known: values not rewritten still hold them
                merged = merge_classes(old["classes"], wanted.get("classes"))
                wanted["classes"] = cleared(merged, scanned, wanted.get("classes") or {})
        state = cls(
            descriptor,
            host=self,
            key_context=self.key_context,
            max_parallelism=self.max_parallelism,
            key_group_range=self.key_group_range,
            now=self._clock.time,
            stream_keys=self._stream_keys,
        )
        self._states[descriptor.name] = state
        self._meta[descriptor.name] = wanted
        limit = self.cache_max_entries // len(self._states)
        for s in self._states.values():
            s.set_cache_limit(limit)
        return state

    def _convert_pickle(self, descriptor: StateDescriptor, ttl: bool) -> None:
        """Rewrite a pickled state's stored values as JSON (``allow_pickle``), logged as changes."""
        self.flush()  # nothing is left queued or half applied
        changed = self._tracker.sink()
        with self._env.begin(write=True) as txn:
            restore_mod.convert_pickle_to_json(
                txn, descriptor.name, self.key_group_range, ttl, changed, json_encoder(descriptor)
            )
        self._drop_rtxn()

    def _misfit(self, descriptor: StateDescriptor) -> str | None:
        """Scan a state's stored values, all writes applied first (see :func:`misfit`)."""
        self.flush()
        return misfit(self.read_txn(), descriptor, self.key_group_range, self._clock.time)

    # -- write sets ------------------------------------------------------------------
    def _freeze(self) -> list[tuple[KeyedStateBase, Any]]:
        """Take every state's write set: O(number of states), not of dirty keys."""
        return [(s, f) for s in self._states.values() if (f := s.freeze()) is not None]

    def flush(self) -> int:
        """Write every pending write set (frozen ones first, then the current one) to LMDB.

        Runs on the event loop, at once (no yielding); cache eviction needs it,
        because after it every cache entry is clean and may be dropped. It
        finishes whatever a snapshot's ``prepare`` or ``settle`` left half
        done, and does the work of those that have not run.
        """
        parts = self._freeze()
        if parts:
            self._writes.enqueue(parts, self._tracker.sink(), None)
        n = self._writes.drain()
        self._drop_rtxn()
        self.last_flush_entries = n
        return n

    def _drop_rtxn(self) -> None:
        rtxn, self._rtxn = self._rtxn, None
        if rtxn is not None:
            rtxn.abort()

    # -- snapshots ----------------------------------------------------------------
    def snapshot(self, target: SnapshotTarget) -> AsyncSnapshotPart:
        """Freeze the write sets (O(1) in the number of dirty keys); return the async part.

        Its ``prepare()`` encodes every write set queued up to this one and
        packs the delta, on the event loop in slices (a full snapshot pins its
        view first); its ``write()`` writes the files; its ``settle()`` applies
        the write sets to LMDB after the snapshot was acknowledged (see
        :mod:`~aiostream_ckpt.state.lmdb.strategy`).
        """
        self._check_open()
        return self._snapshots.snapshot(target, self._freeze, self._meta)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._snapshots.complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._snapshots.abort(checkpoint_id)

    # -- restore --------------------------------------------------------------------
    def restore(self, root: Path, handles: Sequence[StateHandle]) -> None:
        """Rebuild the working copy from old instances' handles (before any state is used)."""
        self._check_open()
        if self._states or self._restored:
            raise StateError("restore() must be called once, before any state is created")
        if self._rtxn is not None:
            self._rtxn.abort()
            self._rtxn = None
        plan = restore_mod.plan(root, handles, self.key_group_range, self.max_parallelism)
        for keys in plan.keys:
            check_key_change(self.operator_uid, keys, self._stream_keys.key_type)
        self._restored = True
        self._meta.update(plan.states)
        if plan.copy_base is not None:
            self._env.close()
            for f in self._dir.iterdir():
                f.unlink()
            shutil.copyfile(plan.copy_base, self._dir / "data.mdb")
            self._env = open_env(self._dir)
        restore_mod.apply(self._env, plan, self.key_group_range)
        key_type = self._stream_keys.key_type
        lost = lost_members(plan.keys, key_type)
        if lost or keys_unrecorded(plan.keys, key_type):
            with self._env.begin() as txn:
                stored = restore_mod.stored_keys(txn, self.key_group_range)
                check_stored_keys(self.operator_uid, key_type, stored, lost)
        if plan.chain_base is not None:  # the working copy is that chain: build on it
            self._snapshots.restored(Path(root), *plan.chain_base)

    # -- queries and lifecycle ------------------------------------------------------
    def keys(self, state_name: str) -> Iterator[Any]:
        self._check_open()
        state = self._states.get(state_name)
        stored: dict[Any, bool] = {}
        part = name_part(state_name)
        loads = self._stream_keys.loads
        cur = self.read_txn().cursor()
        for kg in range(self.key_group_range.start, self.key_group_range.end + 1):
            prefix = key_group_bytes(kg) + part
            if not cur.set_range(prefix):
                break
            for db_key, raw in cur:
                if not db_key.startswith(prefix):
                    break
                rest = db_key[len(prefix) :]
                kb = rest[2 : 2 + int.from_bytes(rest[:2], "big")]
                live = state is None or state.store_live(raw)
                key = loads(kb)
                stored[key] = stored.get(key, False) or live
        if state is None:
            return iter([k for k, live in stored.items() if live])
        return iter(state.live_keys(stored))

    def cached_entries(self, state_name: str) -> int:
        """Entries the cache of a state holds: what a key's reads and ``items()`` walk."""
        self._check_open()
        state = self._states.get(state_name)
        return 0 if state is None else state.cached_entries()

    def working_bytes(self) -> int:
        """Bytes the working LMDB takes on disk (its data file; metrics, tests)."""
        return sum(f.stat().st_blocks * 512 for f in self._dir.iterdir())

    def _check_open(self) -> None:
        if self._closed:
            raise StateError(f"state backend {self._file_stem} is closed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._snapshots.close()
        self._writes.abort()  # the working copy is deleted: unapplied writes go with it
        self._drop_rtxn()
        self._env.close()
        shutil.rmtree(self._dir, ignore_errors=True)
        self._snapshots.unpin_all()

    def __enter__(self) -> LmdbStateBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LmdbStateBackendFactory:
    """Creates one :class:`LmdbStateBackend` per operator instance from job config."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        cache_max_entries: int = 1_000_000,
        full_checkpoint_every: int = 10,
        allow_pickle: bool = False,
        apply_slice_keys: int = APPLY_SLICE_KEYS,
        max_delta_ratio: float = 0.5,
    ) -> None:
        self.clock = clock
        self.cache_max_entries = cache_max_entries
        self.full_checkpoint_every = full_checkpoint_every
        self.allow_pickle = allow_pickle
        self.apply_slice_keys = apply_slice_keys
        self.max_delta_ratio = max_delta_ratio

    def __call__(
        self,
        *,
        operator_uid: str,
        subtask_index: int,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        local_dir: Path,
        key_type: Any = None,
    ) -> LmdbStateBackend:
        return LmdbStateBackend(
            operator_uid=operator_uid,
            subtask_index=subtask_index,
            key_group_range=key_group_range,
            max_parallelism=max_parallelism,
            local_dir=local_dir,
            clock=self.clock,
            cache_max_entries=self.cache_max_entries,
            full_checkpoint_every=self.full_checkpoint_every,
            allow_pickle=self.allow_pickle,
            apply_slice_keys=self.apply_slice_keys,
            max_delta_ratio=self.max_delta_ratio,
            key_type=key_type,
        )
