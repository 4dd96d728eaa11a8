"""The LMDB keyed state backend: one working LMDB environment per operator instance.

A snapshot has four steps. The synchronous part (at the barrier, on the event
loop) only *freezes* every state's write set -- an O(1) swap per state,
independent of the number of dirty keys -- and queues it. The asynchronous
part's ``prepare()`` (on the event loop, in slices) encodes the queued write
sets up to the snapshot's own into records, in barrier order; a full snapshot
then pins a read transaction on the working LMDB; and it packs the delta (an
incremental snapshot's changes since its base, or a full one's *tail*: the
records not applied in the pinned view yet). Its ``write()`` (in a worker
thread) copies the pinned view and writes the packed bytes. Its ``settle()``
(on the loop, in slices, after the ack) applies the records to LMDB, each
write set in one write transaction. A checkpoint thus waits for the encoding,
not for the puts. See :mod:`~aiostream_ckpt.state.lmdb.writes` for the queue:
whoever comes first (a snapshot's ``prepare`` or ``settle``, another
snapshot's, or a flush for a cache eviction, which must write everything
before it may drop entries) does the next slice, so ordering holds no matter
in which order, or whether, the async parts run; an aborted or cancelled
snapshot's writes still reach LMDB with the next applier and are carried into
the next delta by the change tracker.

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

import asyncio
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import msgspec

from aiostream_ckpt.clock import Clock, SystemClock
from aiostream_ckpt.durable import child_path
from aiostream_ckpt.errors import CheckpointError, StateError, StateMigrationError
from aiostream_ckpt.state.backend import (
    AsyncSnapshotPart,
    KeyContext,
    SharedFilePins,
    SnapshotTarget,
    StateHandle,
)
from aiostream_ckpt.state.codecs import UNTYPED_KEYS, StreamKeyCodec, json_encoder
from aiostream_ckpt.state.descriptors import StateDescriptor
from aiostream_ckpt.state.evolution import (
    check_class_change,
    check_type_change,
    cleared,
    declared_classes,
    declared_types,
    merge_classes,
)
from aiostream_ckpt.state.key_evolution import (
    check_key_change,
    check_map_key_change,
    check_stored_keys,
    described_keys,
    keys_unrecorded,
    lost_members,
)
from aiostream_ckpt.state.keygroups import KeyGroupRange
from aiostream_ckpt.state.lmdb import restore as restore_mod
from aiostream_ckpt.state.lmdb.map_state import MapStateImpl, TtlMapState
from aiostream_ckpt.state.lmdb.snapshot import (
    ChangeLog,
    ChangeTracker,
    PackedDelta,
    PendingSnapshot,
    pack_delta,
    write_full,
    write_packed_delta,
)
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
from aiostream_ckpt.state.lmdb.writes import RunState, SnapshotRun, WriteQueue
from aiostream_ckpt.state.local_dirs import working_state_error
from aiostream_ckpt.state.serde import key_group_bytes, name_part

HANDLE_FORMAT = 1
MAP_SIZE = 64 << 30  # sparse; only touched pages take disk
#: LMDB's reader table for max_readers=512 (a 128-byte header, 64 bytes a reader), with room
_LOCK_FILE_BYTES = 64 << 10


def _reserve_lock_file(directory: Path) -> None:
    """Allocate LMDB's ``lock.mdb`` before LMDB maps it.

    LMDB sizes the lock file with ``ftruncate`` (a hole) and writes it through a
    shared mapping: on a full filesystem the first write into the hole is a
    SIGBUS and the process dies without a word. With its blocks allocated
    there is nothing left to fail, and a full disk is an error here instead,
    naming the directory (retriable: space may be freed before the restart).
    """
    fd = -1
    try:
        fd = os.open(directory / "lock.mdb", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        os.posix_fallocate(fd, 0, _LOCK_FILE_BYTES)
    except OSError as exc:
        raise working_state_error(directory, exc) from exc
    finally:
        if fd >= 0:
            os.close(fd)


#: Work per slice on the event loop before it yields: keys encoded, records packed
#: or written; ~0.3-0.7 us each, so ~20-40 ms. Bigger slices finish a checkpoint
#: sooner (its output commits then); 1 M keys, measured: p99 480 ms against 510-560
#: ms with half of it.
APPLY_SLICE_KEYS = 65536

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


@dataclass(slots=True, eq=False)
class _Snapshot:
    """What one snapshot's asynchronous part needs, fixed at its barrier."""

    target: SnapshotTarget
    run: SnapshotRun
    seq: int  # its write set
    full: bool
    pending: PendingSnapshot
    base_chain: list[dict[str, Any]]
    base_id: int | None  # the completed checkpoint whose chain base_chain is
    #: whether the base may be referenced as is if nothing changed since (not in a
    #: savepoint, which is self-contained; not with full_every 1, which logs no changes)
    may_reuse: bool
    change_logs: list[ChangeLog]  # an incremental one's delta, oldest first
    states: dict[str, dict[str, Any]]
    delta: PackedDelta | None = None  # packed by prepare(): the delta, or a full one's tail


class _LmdbSnapshotPart:
    """The :class:`~aiostream_ckpt.state.backend.AsyncSnapshotPart` of one LMDB snapshot."""

    __slots__ = ("_backend", "_snap")

    def __init__(self, backend: LmdbStateBackend, snap: _Snapshot) -> None:
        self._backend = backend
        self._snap = snap

    async def prepare(self) -> None:
        """Encode the write sets up to this one, pin a full one's view, pack the delta."""
        await self._backend._prepare(self._snap)

    def write(self) -> StateHandle:
        """Write the files (in a worker thread): I/O and C-level copying only."""
        return self._backend._write(self._snap)

    async def settle(self) -> None:
        """Apply the write sets up to this one to LMDB, in slices."""
        await self._backend._settle(self._snap.seq)


def _safe(text: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:80]
    if safe != text:
        safe += "-" + uuid.uuid5(uuid.NAMESPACE_OID, text).hex[:8]
    return safe


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
        self._file_stem = f"{_safe(operator_uid)}-{subtask_index}"
        self._dir = Path(local_dir) / f"lmdb-{self._file_stem}-{self._token}"
        self._owner = f"{self._file_stem}-{self._token}"
        self._pins: SharedFilePins | None = None
        self._dir.mkdir(parents=True)
        self._env = self._open_env()
        self._rtxn: lmdb.Transaction[bytes] | None = None
        self._states: dict[str, KeyedStateBase] = {}
        self._meta: dict[str, dict[str, Any]] = {}  # per-state kind/serializer/ttl, incl. restored
        self._restored = False
        self._tracker = ChangeTracker(full_checkpoint_every, max_delta_ratio)
        self._runs_cond = threading.Condition()
        self._runs: dict[int, SnapshotRun] = {}
        self._writes = WriteQueue(
            lambda: self._env, self.read_txn, apply_slice_keys, on_commit=self._drop_rtxn
        )
        self._closed = False
        self.last_flush_entries = 0

    def _open_env(self) -> lmdb.Environment:
        _reserve_lock_file(self._dir)
        return lmdb.open(
            str(self._dir),
            map_size=MAP_SIZE,
            subdir=True,
            writemap=False,
            sync=False,
            metasync=False,
            lock=True,
            readahead=False,
            max_dbs=0,
            max_readers=512,
        )

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

    # -- states ------------------------------------------------------------------------
    def create_state(self, descriptor: StateDescriptor) -> Any:
        self._check_open()
        existing = self._states.get(descriptor.name)
        if existing is not None:
            if existing.descriptor == descriptor:  # asked again (per record, in some apps)
                return existing
            if self._describe(existing.descriptor) != self._describe(descriptor):
                raise StateError(
                    f"state {descriptor.name!r} was already created as "
                    f"{self._describe(existing.descriptor)}, now requested as "
                    f"{self._describe(descriptor)}"
                )
            return existing
        cls = _CLASSES.get((descriptor.kind, descriptor.ttl is not None))
        if descriptor.value_types()[0] is not None and descriptor.serializer == "json":
            cls = _TYPED.get(cls, cls)  # checks every value it is given
        if cls is None:
            raise StateError(f"state {descriptor.name!r}: unsupported descriptor {descriptor!r}")
        wanted = self._describe(descriptor)
        old = self._meta.get(descriptor.name)
        if old is not None and old != wanted:
            scanned = self._migrate(descriptor, old, wanted)
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

    @staticmethod
    def _describe(d: StateDescriptor) -> dict[str, Any]:
        described: dict[str, Any] = {
            "kind": d.kind,
            "serializer": d.serializer,
            "ttl": d.ttl is not None,
            "types": declared_types(d),
        }
        if classes := declared_classes(d):
            described["classes"] = classes
        return described

    def _migrate(
        self, descriptor: StateDescriptor, old: dict[str, Any], new: dict[str, Any]
    ) -> list[tuple[str, str]]:
        """Accept a changed descriptor only where the stored bytes can be converted safely.

        Returns the class fields a scan of the stored values found in every one
        (see :func:`check_class_change`).
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
            return check_class_change(
                name, old.get("classes"), descriptor, lambda: self._misfit(descriptor, old)
            )
        if (old["serializer"], new["serializer"]) != ("pickle", "json"):
            raise StateMigrationError(
                f"state {name!r} was snapshotted with serializer {old['serializer']!r}, "
                f"the job now declares {new['serializer']!r}"
            )
        if not self._allow_pickle:
            raise StateMigrationError(
                f"state {name!r} was snapshotted with pickle; refusing to unpickle it for a "
                "json descriptor (declare serializer='pickle', or set allow_pickle=True to "
                "convert it)"
            )
        self.flush()  # nothing is left queued or half applied
        changed = self._tracker.sink()
        with self._env.begin(write=True) as txn:
            restore_mod.convert_pickle_to_json(
                txn, name, self.key_group_range, old["ttl"], changed, json_encoder(descriptor)
            )
        self._drop_rtxn()
        return []

    def _misfit(self, descriptor: StateDescriptor, old: dict[str, Any]) -> str | None:
        """Decode every stored value of a state into its declared type: the first error, or None.

        Only where the record cannot say (a field now required that values
        written in earlier runs may lack, an enum that lost members): a scan
        of this instance's values, expired ones (TTL) skipped: no read decodes
        them; and of a map state's map keys, whose enums the record shares.
        """
        self.flush()
        own, txn = self.key_group_range, self.read_txn()
        ttl = None if descriptor.ttl is None else (self._clock.time(), descriptor.ttl.ttl)
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

    # -- write sets ------------------------------------------------------------------
    def _freeze(self) -> list[tuple[KeyedStateBase, Any]]:
        """Take every state's write set: O(number of states), not of dirty keys."""
        return [(s, f) for s in self._states.values() if (f := s.freeze()) is not None]

    async def _prepare(self, snap: _Snapshot) -> None:
        """Do all of a snapshot's interpreter work on the loop, yielding every ``apply_slice_keys``.

        Encode up to its write set; a full snapshot not pinned at its own
        commit yet pins the committed view now, with the records of the write
        sets up to its own not applied in it as its tail; then pack the delta
        (or tail). Several of these may run at once (snapshots whose async
        parts overlap) and a flush may run between two slices: they all take
        the next slice of the same queue.
        """
        writes = self._writes
        run, seq = snap.run, snap.seq
        budget = writes.slice_keys

        def encode() -> bool:
            n = 0
            while n < budget and writes.encoded_seq < seq:
                n += writes.encode_slice() or 1
            return writes.encoded_seq >= seq

        await self._in_slices(run, encode)
        if snap.full and snap.may_reuse and not any(log.batches for log in snap.change_logs):
            # due for a full copy (full_every, max_delta_ratio) but nothing changed since
            # the base: it stays the restore point, with the chain its rules accepted
            snap.full = False
            run.drop_view()
        if snap.full:
            if run.txn is None:
                run.pin(self._env, writes.unapplied_records(seq))
            logs = run.tail
        else:
            logs = snap.change_logs
        delta = PackedDelta()
        packing = pack_delta(logs, delta)

        def pack() -> bool:
            n = 0
            for records in packing:
                n += records
                if n >= budget:
                    return False
            return True

        await self._in_slices(run, pack)
        snap.delta = delta

    async def _in_slices(self, run: SnapshotRun, work: Callable[[], bool]) -> None:
        """Call ``work`` (a slice; True once all is done), yielding to the loop in between."""
        while True:
            if run.state is not RunState.PENDING or self._closed:
                raise CheckpointError(f"snapshot {run.label} was cancelled")
            if work():
                return
            await asyncio.sleep(0)

    async def _settle(self, seq: int) -> None:
        """Apply up to write set ``seq`` to LMDB, yielding every ``apply_slice_keys``."""
        writes = self._writes
        budget = writes.slice_keys
        while not self._closed and writes.applied_seq < seq:
            done = 0
            while done < budget and writes.applied_seq < seq:
                done += writes.step() or 1
            if writes.applied_seq < seq:
                await asyncio.sleep(0)

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
        the write sets to LMDB after the snapshot was acknowledged.
        """
        self._check_open()
        cid = target.checkpoint_id
        if cid in self._runs or cid in self._tracker.pending:
            raise CheckpointError(f"snapshot {cid} of {self._file_stem} was already taken")
        pending, sink, full, base_chain, change_logs = self._tracker.begin(cid, target.is_savepoint)
        may_reuse = bool(base_chain) and not target.is_savepoint and self._tracker.full_every > 1
        if target.pins is not None:
            self._pins = target.pins
            if may_reuse:  # a delta builds on it, or it is this snapshot (no change)
                target.pins.pin(self._owner, cid, [e["path"] for e in base_chain])
        run = SnapshotRun(self._runs_cond, f"{cid} of {self._file_stem}")
        seq = self._writes.enqueue(self._freeze(), sink, run if full else None)
        with self._runs_cond:
            self._runs[cid] = run
        states = {name: dict(meta) for name, meta in self._meta.items()}
        base_id = self._tracker.base_id
        snap = _Snapshot(
            target, run, seq, full, pending, base_chain, base_id, may_reuse, change_logs, states
        )
        return _LmdbSnapshotPart(self, snap)

    def _write(self, snap: _Snapshot) -> StateHandle:
        run = snap.run
        if not run.start():
            raise CheckpointError(f"snapshot {run.label} was cancelled")
        try:
            if snap.delta is None or (snap.full and run.txn is None):
                raise CheckpointError(f"snapshot {run.label}: write() before prepare()")
            try:
                return self._write_files(snap, snap.delta)
            except (OSError, lmdb.Error) as exc:
                t = snap.target
                where = t.exclusive_dir if t.is_savepoint else t.shared_dir
                full = "No space left" in str(exc)
                raise CheckpointError(
                    f"snapshot {run.label}: cannot write its files into {where}: {exc}"
                    + (" (checkpoint storage is full)" if full else "")
                ) from exc
        finally:
            snap.delta = None  # the packed bytes are in the file now
            run.finish()
            with self._runs_cond:
                self._runs.pop(snap.target.checkpoint_id, None)

    def _write_files(self, snap: _Snapshot, delta: PackedDelta) -> StateHandle:
        started = time.perf_counter()
        target = snap.target
        out_dir = target.exclusive_dir if target.is_savepoint else target.shared_dir
        if not snap.full and not delta.records:  # nothing changed since the base
            return self._handle(snap, snap.base_chain, [], 0, started)
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = f"{self._file_stem}-{target.checkpoint_id}-{self._token}"

        def entry(path: Path, kind: str, size: int, digest: str) -> dict[str, Any]:
            return {"path": target.relative(path), "kind": kind, "size": size, "sha256": digest}

        def pin(path: Path) -> Path:
            if target.pins is not None:  # before the file exists: retention may be listing
                target.pins.pin(self._owner, target.checkpoint_id, [target.relative(path)])
            return path

        records: int | None = None
        if snap.full:
            assert snap.run.txn is not None
            path = pin(child_path(out_dir, f"{stem}-full.mdb"))
            new = [entry(path, "full", *write_full(self._env, snap.run.txn, path))]
            if delta.records:  # what the copied view does not have yet
                path = pin(child_path(out_dir, f"{stem}-tail.bin"))
                size, digest, records = write_packed_delta(delta, path)
                # part of this full snapshot, not a checkpoint of its own
                new.append({**entry(path, "delta", size, digest), "tail": True})
            chain = new
        else:
            path = pin(child_path(out_dir, f"{stem}-delta.bin"))
            size, digest, records = write_packed_delta(delta, path)
            new = [entry(path, "delta", size, digest)]
            chain = [*snap.base_chain, *new]
        return self._handle(snap, chain, new, records, started)

    def _handle(
        self,
        snap: _Snapshot,
        chain: list[dict[str, Any]],
        new: list[dict[str, Any]],
        records: int | None,
        started: float,
    ) -> StateHandle:
        """Describe a snapshot whose ``chain`` ends in the ``new`` files it wrote.

        No new file: nothing changed since the completed checkpoint
        ``unchanged_since``, whose chain this one references as is (Flink's
        shared state handles). An idle instance then writes and fsyncs
        nothing, and its chain, so its restore cost, stays as it was.
        """
        target = snap.target
        snap.pending.chain = chain
        handle: StateHandle = {
            "backend": "lmdb",
            "format": HANDLE_FORMAT,
            "operator_uid": self.operator_uid,
            "subtask_index": self.subtask_index,
            "checkpoint_id": target.checkpoint_id,
            "kind": "full" if snap.full else "incremental",
            "key_group_range": self.key_group_range.to_json(),
            "max_parallelism": self.max_parallelism,
            "keys": self._keys_record,
            "states": snap.states,
            "chain": chain,
            "files": [e["path"] for e in chain],
            "size_bytes": sum(e["size"] for e in new),
            "full_size_bytes": sum(e["size"] for e in chain),
            "delta_records": records,
            "write_seconds": round(time.perf_counter() - started, 6),
        }
        if not new:
            handle["unchanged_since"] = snap.base_id
        return handle

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._tracker.complete(checkpoint_id)
        self._release_run(checkpoint_id)
        if self._pins is not None and self._tracker.base_id == checkpoint_id:
            self._pins.unpin(self._owner, below=checkpoint_id)  # n's chain is the base now

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._tracker.abort(checkpoint_id)
        self._release_run(checkpoint_id)
        if self._pins is not None:
            self._pins.unpin(self._owner, only=checkpoint_id)

    def _release_run(self, checkpoint_id: int) -> None:
        with self._runs_cond:
            run = self._runs.get(checkpoint_id)
            if run is not None and run.state is RunState.PENDING:
                run.cancel()
                del self._runs[checkpoint_id]

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
            self._env = self._open_env()
        restore_mod.apply(self._env, plan, self.key_group_range)
        key_type = self._stream_keys.key_type
        lost = lost_members(plan.keys, key_type)
        if lost or keys_unrecorded(plan.keys, key_type):
            with self._env.begin() as txn:
                stored = restore_mod.stored_keys(txn, self.key_group_range)
                check_stored_keys(self.operator_uid, key_type, stored, lost)

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
        with self._runs_cond:
            for run in self._runs.values():
                run.cancel()
            while any(r.state is RunState.RUNNING for r in self._runs.values()):
                self._runs_cond.wait()
            self._runs.clear()
        self._writes.abort()  # the working copy is deleted: unapplied writes go with it
        self._drop_rtxn()
        self._env.close()
        shutil.rmtree(self._dir, ignore_errors=True)
        if self._pins is not None:
            self._pins.unpin(self._owner, below=1 << 62)

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
