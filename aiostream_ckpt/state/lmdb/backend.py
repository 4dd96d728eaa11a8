"""The LMDB keyed state backend: one working LMDB environment per operator instance.

Snapshots are copy-on-write in two steps. The synchronous part (at the barrier,
on the event loop) only *freezes* every state's write set -- an O(1) swap per
state, independent of the number of dirty keys -- and queues it. The
asynchronous part (a worker thread) applies the queued write sets in barrier
order, each in one write transaction, pins a read transaction right after its
own one committed, and copies that view. Whoever applies a snapshot's write
set pins its view: usually its own async part, but also an earlier-running
later async part or a cache eviction on the event loop, which must write
everything before it may drop entries. So ordering holds no matter in which
order, or whether, the async parts run; an aborted or cancelled snapshot's
writes still reach LMDB with the next applier and are carried into the next
delta by the change tracker.

Threading: LMDB allows one write transaction at a time, and the order of
applied write sets matters, so every LMDB write happens under ``_write_lock``
(async parts in worker threads, flushes on the event loop). The event loop
never waits for that lock at the barrier, only when it flushes (eviction). The
async part touches only frozen write sets, its pinned read transaction
(py-lmdb opens environments with ``MDB_NOTLS``, so a read transaction may move
between threads) and the files it writes. Reads on the event loop use their
own read transaction, renewed after every commit so that it does not hold old
pages; any committed view is correct for them, because the caches hold the
newest entry of every key with an unapplied write (see
:mod:`~aiostream_ckpt.state.lmdb.states`). :meth:`~LmdbStateBackend.close`
waits for running snapshot threads, because closing the environment under a
running copy would free mapped memory.
"""

from __future__ import annotations

import enum
import re
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from aiostream_ckpt.clock import Clock, SystemClock
from aiostream_ckpt.errors import CheckpointError, StateError, StateMigrationError
from aiostream_ckpt.state.backend import (
    AsyncSnapshotPart,
    KeyContext,
    SnapshotTarget,
    StateHandle,
)
from aiostream_ckpt.state.descriptors import StateDescriptor
from aiostream_ckpt.state.keygroups import KeyGroupRange
from aiostream_ckpt.state.lmdb import restore as restore_mod
from aiostream_ckpt.state.lmdb.map_state import MapStateImpl, TtlMapState
from aiostream_ckpt.state.lmdb.snapshot import (
    ChangeLog,
    ChangeTracker,
    PendingSnapshot,
    write_delta,
    write_full,
)
from aiostream_ckpt.state.lmdb.states import (
    KeyedStateBase,
    ListStateImpl,
    ReducingStateImpl,
    TtlListState,
    TtlReducingState,
    TtlValueState,
    ValueStateImpl,
)
from aiostream_ckpt.state.serde import decode_key, key_group_bytes, name_part

HANDLE_FORMAT = 1
MAP_SIZE = 64 << 30  # sparse; only touched pages take disk

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


class RunState(enum.Enum):
    """Lifecycle of one asynchronous snapshot part: PENDING → RUNNING → DONE, or → CANCELLED."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"


class _SnapshotRun:
    """Owns the read transaction of one snapshot, pinned when its write set has committed."""

    __slots__ = ("cond", "state", "txn")

    def __init__(self, cond: threading.Condition) -> None:
        self.txn: lmdb.Transaction[bytes] | None = None
        self.cond = cond
        self.state = RunState.PENDING

    def pin(self, env: lmdb.Environment) -> None:
        """Pin the current view (called under the write lock right after the commit)."""
        with self.cond:
            if self.txn is None and self.state in (RunState.PENDING, RunState.RUNNING):
                self.txn = env.begin(buffers=False)

    def start(self) -> bool:
        with self.cond:
            if self.state is not RunState.PENDING:
                return False
            self.state = RunState.RUNNING
            return True

    def finish(self) -> None:
        with self.cond:
            self._release()
            self.state = RunState.DONE
            self.cond.notify_all()

    def cancel(self) -> None:
        """Release the transaction if the async part never started (it is ours then)."""
        with self.cond:
            if self.state is RunState.PENDING:
                self._release()
                self.state = RunState.CANCELLED

    def _release(self) -> None:
        if self.txn is not None:
            self.txn.abort()
            self.txn = None


@dataclass(slots=True, eq=False)
class _WriteSet:
    """Frozen write sets of every state for one epoch (``run`` set) or one flush."""

    seq: int  # barrier/flush order: write sets are applied strictly in this order
    parts: list[tuple[KeyedStateBase, Any]]
    changes: ChangeLog | None  # where applying logs what it wrote to LMDB
    run: _SnapshotRun | None  # the snapshot whose view is pinned right after this commit


def _safe(text: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:80]
    if safe != text:
        safe += "-" + uuid.uuid5(uuid.NAMESPACE_OID, text).hex[:8]
    return safe


class LmdbStateBackend:
    """Keyed state of one operator instance in LMDB, behind a write-behind dict cache.

    ``full_checkpoint_every=N`` bounds the incremental chain to one full file and
    ``N-1`` deltas (1 means every snapshot is full). ``allow_pickle`` lets a
    json descriptor open a state that was snapshotted with pickle by converting
    it (which unpickles); without it that is a :class:`StateMigrationError`.
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
    ) -> None:
        if full_checkpoint_every < 1:
            raise StateError("full_checkpoint_every must be >= 1")
        if not 0 <= key_group_range.start <= key_group_range.end < max_parallelism:
            raise StateError(f"key group range {key_group_range} outside [0, {max_parallelism})")
        self.operator_uid = operator_uid
        self.subtask_index = subtask_index
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.key_context = KeyContext()
        self._clock: Clock = clock or SystemClock()
        self._cache_max_entries = cache_max_entries
        self._allow_pickle = allow_pickle
        self._token = uuid.uuid4().hex[:8]
        self._file_stem = f"{_safe(operator_uid)}-{subtask_index}"
        self._dir = Path(local_dir) / f"lmdb-{self._file_stem}-{self._token}"
        self._dir.mkdir(parents=True)
        self._env = self._open_env()
        self._rtxn: lmdb.Transaction[bytes] | None = None
        self._states: dict[str, KeyedStateBase] = {}
        self._meta: dict[str, dict[str, Any]] = {}  # per-state kind/serializer/ttl, incl. restored
        self._restored = False
        self._tracker = ChangeTracker(full_checkpoint_every)
        self._runs_cond = threading.Condition()
        self._runs: dict[int, _SnapshotRun] = {}
        self._write_lock = threading.Lock()
        self._queue: deque[_WriteSet] = deque()  # frozen, not yet applied; appended on the loop
        self._seq = 0
        self._lmdb_gen = 0  # bumped (under the write lock) after every commit
        self._rtxn_gen = 0
        self._closed = False
        self.last_flush_entries = 0

    def _open_env(self) -> lmdb.Environment:
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
        txn = self._rtxn
        gen = self._lmdb_gen  # read before begin(): the view is at least this new
        if txn is None or gen != self._rtxn_gen:
            if txn is not None:
                txn.abort()  # a stale view is still correct, but pins old pages
            self._rtxn_gen = gen
            txn = self._rtxn = self._env.begin(buffers=False)
        return txn

    def cache_full(self, state: KeyedStateBase) -> None:
        self.flush()
        state.evict()

    def trim_caches(self) -> None:
        """Evict from every state whose cache outgrew its limit.

        The task calls this after every batch and timer firing, so the hottest
        write (``ValueState.update``) needs no size check of its own; a cache
        may exceed its limit by the keys one batch touches.
        """
        for state in self._states.values():
            if state.over_limit():
                self.cache_full(state)

    # -- states ------------------------------------------------------------------------
    def create_state(self, descriptor: StateDescriptor) -> Any:
        self._check_open()
        existing = self._states.get(descriptor.name)
        if existing is not None:
            if self._describe(existing.descriptor) != self._describe(descriptor):
                raise StateError(
                    f"state {descriptor.name!r} was already created as "
                    f"{self._describe(existing.descriptor)}, now requested as "
                    f"{self._describe(descriptor)}"
                )
            return existing
        cls = _CLASSES.get((descriptor.kind, descriptor.ttl is not None))
        if cls is None:
            raise StateError(f"state {descriptor.name!r}: unsupported descriptor {descriptor!r}")
        wanted = self._describe(descriptor)
        old = self._meta.get(descriptor.name)
        if old is not None and old != wanted:
            self._migrate(descriptor.name, old, wanted)
        state = cls(
            descriptor,
            host=self,
            key_context=self.key_context,
            max_parallelism=self.max_parallelism,
            key_group_range=self.key_group_range,
            now=self._clock.time,
        )
        self._states[descriptor.name] = state
        self._meta[descriptor.name] = wanted
        limit = self._cache_max_entries // len(self._states)
        for s in self._states.values():
            s.set_cache_limit(limit)
        return state

    @staticmethod
    def _describe(d: StateDescriptor) -> dict[str, Any]:
        return {"kind": d.kind, "serializer": d.serializer, "ttl": d.ttl is not None}

    def _migrate(self, name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        """Accept a changed descriptor only where the stored bytes can be converted safely."""
        if old["kind"] != new["kind"] or old["ttl"] != new["ttl"]:
            raise StateMigrationError(
                f"state {name!r} was snapshotted as {old}, the job now declares {new}"
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
        self.flush()
        with self._write_lock:
            changed = self._tracker.sink()
            with self._env.begin(write=True) as txn:
                restore_mod.convert_pickle_to_json(
                    txn, name, self.key_group_range, old["ttl"], changed
                )
            self._lmdb_gen += 1
        self._drop_rtxn()

    # -- write sets ------------------------------------------------------------------
    def _freeze(self) -> list[tuple[KeyedStateBase, Any]]:
        """Take every state's write set: O(number of states), not of dirty keys."""
        return [(s, f) for s in self._states.values() if (f := s.freeze()) is not None]

    def _enqueue(
        self,
        parts: list[tuple[KeyedStateBase, Any]],
        changes: ChangeLog | None,
        run: _SnapshotRun | None,
    ) -> int:
        self._seq += 1
        self._queue.append(_WriteSet(self._seq, parts, changes, run))
        return self._seq

    def _apply_through(self, last: int | None) -> int:
        """Apply queued write sets in order up to ``last`` (all when None); hold the lock.

        Each is one write transaction; a snapshot's view is pinned right after
        its own commit and before the next one. A write set that fails stays
        queued (its transaction is rolled back), so nothing is lost or reordered.
        """
        n = 0
        queue = self._queue
        while queue and (last is None or queue[0].seq <= last):
            ws = queue[0]
            if ws.parts:
                with self._env.begin(write=True) as txn:
                    for state, frozen in ws.parts:
                        n += state.apply(txn, frozen, ws.changes)
                self._lmdb_gen += 1
            queue.popleft()
            if ws.run is not None:
                ws.run.pin(self._env)
        return n

    def flush(self) -> int:
        """Write every pending write set (frozen ones first, then the current one) to LMDB.

        Runs on the event loop; cache eviction needs it, because after it every
        cache entry is clean and may be dropped. It waits for an async part
        that is applying a write set, and does the work of any that has not.
        """
        with self._write_lock:
            parts = self._freeze()
            if parts:
                self._enqueue(parts, self._tracker.sink(), None)
            n = self._apply_through(None)
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

        The async part applies every write set queued up to this one, then
        writes the files from the view pinned right after this one committed.
        """
        self._check_open()
        cid = target.checkpoint_id
        if cid in self._runs or cid in self._tracker.pending:
            raise CheckpointError(f"snapshot {cid} of {self._file_stem} was already taken")
        pending, sink, full, base_chain, change_logs = self._tracker.begin(cid, target.is_savepoint)
        run = _SnapshotRun(self._runs_cond)
        seq = self._enqueue(self._freeze(), sink, run)
        with self._runs_cond:
            self._runs[cid] = run
        states = {name: dict(meta) for name, meta in self._meta.items()}

        def write() -> StateHandle:
            if not run.start():
                raise CheckpointError(f"snapshot {cid} of {self._file_stem} was cancelled")
            try:
                with self._write_lock:
                    self._apply_through(seq)
                txn = run.txn
                if txn is None:  # cannot happen: applying through seq pinned it
                    raise CheckpointError(f"snapshot {cid} of {self._file_stem} has no view")
                return self._write_snapshot(
                    target, txn, pending, full, base_chain, change_logs, states
                )
            finally:
                run.finish()
                with self._runs_cond:
                    self._runs.pop(cid, None)

        return write

    def _write_snapshot(
        self,
        target: SnapshotTarget,
        txn: lmdb.Transaction[bytes],
        pending: PendingSnapshot,
        full: bool,
        base_chain: list[dict[str, Any]],
        change_logs: list[ChangeLog],
        states: dict[str, dict[str, Any]],
    ) -> StateHandle:
        started = time.perf_counter()
        out_dir = target.exclusive_dir if target.is_savepoint else target.shared_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = f"{self._file_stem}-{target.checkpoint_id}-{self._token}"
        if full:
            path = out_dir / f"{stem}-full.mdb"
            size, digest = write_full(self._env, txn, path)
            entry = {"path": target.relative(path), "kind": "full", "size": size, "sha256": digest}
            chain = [entry]
            records = None
        else:
            path = out_dir / f"{stem}-delta.bin"
            size, digest, records = write_delta(change_logs, path)
            entry = {"path": target.relative(path), "kind": "delta", "size": size, "sha256": digest}
            chain = [*base_chain, entry]
        pending.chain = chain
        return {
            "backend": "lmdb",
            "format": HANDLE_FORMAT,
            "operator_uid": self.operator_uid,
            "subtask_index": self.subtask_index,
            "checkpoint_id": target.checkpoint_id,
            "kind": "full" if full else "incremental",
            "key_group_range": self.key_group_range.to_json(),
            "max_parallelism": self.max_parallelism,
            "states": states,
            "chain": chain,
            "files": [e["path"] for e in chain],
            "size_bytes": size,
            "full_size_bytes": sum(e["size"] for e in chain),
            "delta_records": records,
            "write_seconds": round(time.perf_counter() - started, 6),
        }

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._tracker.complete(checkpoint_id)
        self._release_run(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._tracker.abort(checkpoint_id)
        self._release_run(checkpoint_id)

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
        self._restored = True
        self._meta.update(plan.states)
        if plan.copy_base is not None:
            self._env.close()
            for f in self._dir.iterdir():
                f.unlink()
            shutil.copyfile(plan.copy_base, self._dir / "data.mdb")
            self._env = self._open_env()
        restore_mod.apply(self._env, plan, self.key_group_range)

    # -- queries and lifecycle ------------------------------------------------------
    def keys(self, state_name: str) -> Iterator[Any]:
        self._check_open()
        state = self._states.get(state_name)
        stored: dict[Any, bool] = {}
        part = name_part(state_name)
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
                key = decode_key(kb)
                stored[key] = stored.get(key, False) or live
        if state is None:
            return iter([k for k, live in stored.items() if live])
        return iter(state.live_keys(stored))

    def restored_states(self) -> dict[str, dict[str, Any]]:
        """States present in the restored snapshot (the runtime may reject unknown ones)."""
        return {name: dict(meta) for name, meta in self._meta.items()}

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
        with self._write_lock:  # nothing else can hold it now; taken for clarity
            self._queue.clear()  # the working copy is deleted: unapplied writes go with it
            self._drop_rtxn()
            self._env.close()
        shutil.rmtree(self._dir, ignore_errors=True)

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
    ) -> None:
        self.clock = clock
        self.cache_max_entries = cache_max_entries
        self.full_checkpoint_every = full_checkpoint_every
        self.allow_pickle = allow_pickle

    def __call__(
        self,
        *,
        operator_uid: str,
        subtask_index: int,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        local_dir: Path,
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
        )
