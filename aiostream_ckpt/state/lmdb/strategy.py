"""How an LMDB backend takes its snapshots (Flink's ``RocksIncrementalSnapshotStrategy``).

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

The strategy is apart from the backend because it is the backend's one
conversation with checkpoint storage: which files a snapshot writes, which
files of earlier checkpoints it references (and pins while it may), and what
its handle says.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from aiostream_ckpt.durable import child_path
from aiostream_ckpt.errors import CheckpointError
from aiostream_ckpt.state.backend import (
    AsyncSnapshotPart,
    SharedFilePins,
    SnapshotTarget,
    StateHandle,
)
from aiostream_ckpt.state.lmdb.snapshot import (
    ChangeLog,
    ChangeTracker,
    PackedDelta,
    PendingSnapshot,
    pack_delta,
    write_full,
    write_packed_delta,
)
from aiostream_ckpt.state.lmdb.states import KeyedStateBase
from aiostream_ckpt.state.lmdb.writes import RunState, SnapshotRun, WriteQueue

HANDLE_FORMAT = 1


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

    __slots__ = ("_snap", "_strategy")

    def __init__(self, strategy: SnapshotStrategy, snap: _Snapshot) -> None:
        self._strategy = strategy
        self._snap = snap

    async def prepare(self) -> None:
        """Encode the write sets up to this one, pin a full one's view, pack the delta."""
        await self._strategy.prepare(self._snap)

    def write(self) -> StateHandle:
        """Write the files (in a worker thread): I/O and C-level copying only."""
        return self._strategy.write(self._snap)

    async def settle(self) -> None:
        """Apply the write sets up to this one to LMDB, in slices."""
        await self._strategy.settle(self._snap.seq)


class SnapshotStrategy:
    """Takes the snapshots of one backend's working LMDB, full or incremental.

    ``env`` returns the working environment (a restore replaces it);
    ``handle_fields`` are what every handle of this instance says about it
    (operator, subtask, key groups); ``file_stem`` and ``token`` name its
    files, ``owner`` its pins.
    """

    def __init__(
        self,
        *,
        env: Callable[[], lmdb.Environment],
        writes: WriteQueue,
        tracker: ChangeTracker,
        handle_fields: Mapping[str, Any],
        file_stem: str,
        token: str,
        owner: str,
    ) -> None:
        self._env = env
        self._writes = writes
        self.tracker = tracker
        self._handle_fields = dict(handle_fields)
        self._file_stem = file_stem
        self._token = token
        self._owner = owner
        self._pins: SharedFilePins | None = None
        self._runs_cond = threading.Condition()
        self._runs: dict[int, SnapshotRun] = {}
        self._closed = False
        #: the checkpoint storage root of a restored chain the tracker builds on, until
        #: the first checkpoint's target shows whether its files are that storage's
        self._restored_root: Path | None = None

    def restored(self, root: Path, checkpoint_id: int, chain: list[dict[str, Any]]) -> None:
        """Build the next checkpoint on the chain the working copy was restored from.

        Flink's incremental checkpoints after a restore: the restored files are
        referenced, only what changed since is written. Safe because a chain
        file is immutable and never rewritten (new files carry this backend's
        token), and because every reference is protected as the base of any
        other incremental snapshot is: the snapshot pins the chain before it is
        written, and once completed its metadata lists the files, which
        retention then keeps however old their checkpoint. Between the restore
        and that pin no retention runs (it follows a completion, and none
        completes before every task snapshotted), and until the new metadata
        is durable the restored checkpoint is the one a restart restores.
        Only the first checkpoint's target can tell whether the files are in
        its storage's shared directory (not a savepoint's, which must stay
        self-contained, nor another job directory's): see :meth:`snapshot`.
        """
        self.tracker.restored(checkpoint_id, chain)
        self._restored_root = root.resolve()

    def _builds_on_restored(self, target: SnapshotTarget) -> bool:
        """Whether a restored chain's files are shared files of ``target``'s storage."""
        shared = target.relative(target.shared_dir) + "/"
        chain = self.tracker.base_chain or []
        return target.root.resolve() == self._restored_root and all(
            e["path"].startswith(shared) for e in chain
        )

    def snapshot(
        self,
        target: SnapshotTarget,
        freeze: Callable[[], list[tuple[KeyedStateBase, Any]]],
        meta: Mapping[str, dict[str, Any]],
    ) -> AsyncSnapshotPart:
        """Seal the epoch, queue the write sets ``freeze`` takes; return the async part."""
        cid = target.checkpoint_id
        if cid in self._runs or cid in self.tracker.pending:
            raise CheckpointError(f"snapshot {cid} of {self._file_stem} was already taken")
        if self._restored_root is not None and not target.is_savepoint:
            if not self._builds_on_restored(target):
                self.tracker.forget_base()  # a full copy, in this storage
            self._restored_root = None
        pending, sink, full, base_chain, change_logs = self.tracker.begin(cid, target.is_savepoint)
        may_reuse = bool(base_chain) and not target.is_savepoint and self.tracker.full_every > 1
        if target.pins is not None:
            self._pins = target.pins
            if may_reuse:  # a delta builds on it, or it is this snapshot (no change)
                target.pins.pin(self._owner, cid, [e["path"] for e in base_chain])
        run = SnapshotRun(self._runs_cond, f"{cid} of {self._file_stem}")
        seq = self._writes.enqueue(freeze(), sink, run if full else None)
        with self._runs_cond:
            self._runs[cid] = run
        states = {name: dict(m) for name, m in meta.items()}
        base_id = self.tracker.base_id
        snap = _Snapshot(
            target, run, seq, full, pending, base_chain, base_id, may_reuse, change_logs, states
        )
        return _LmdbSnapshotPart(self, snap)

    async def prepare(self, snap: _Snapshot) -> None:
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
                run.pin(self._env(), writes.unapplied_records(seq))
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

    async def settle(self, seq: int) -> None:
        """Apply up to write set ``seq`` to LMDB, yielding every ``apply_slice_keys``."""
        writes = self._writes
        budget = writes.slice_keys
        while not self._closed and writes.applied_seq < seq:
            done = 0
            while done < budget and writes.applied_seq < seq:
                done += writes.step() or 1
            if writes.applied_seq < seq:
                await asyncio.sleep(0)

    def write(self, snap: _Snapshot) -> StateHandle:
        """Write a prepared snapshot's files (in a worker thread); return its handle."""
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
            new = [entry(path, "full", *write_full(self._env(), snap.run.txn, path))]
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
        fields = self._handle_fields
        handle: StateHandle = {
            "backend": "lmdb",
            "format": HANDLE_FORMAT,
            "operator_uid": fields["operator_uid"],
            "subtask_index": fields["subtask_index"],
            "checkpoint_id": target.checkpoint_id,
            "kind": "full" if snap.full else "incremental",
            "key_group_range": fields["key_group_range"],
            "max_parallelism": fields["max_parallelism"],
            "keys": fields["keys"],
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

    def complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: its chain may be the next base."""
        self.tracker.complete(checkpoint_id)
        self._release_run(checkpoint_id)
        if self._pins is not None and self.tracker.base_id == checkpoint_id:
            self._pins.unpin(self._owner, below=checkpoint_id)  # n's chain is the base now

    def abort(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted: its changes go into the next delta."""
        self.tracker.abort(checkpoint_id)
        self._release_run(checkpoint_id)
        if self._pins is not None:
            self._pins.unpin(self._owner, only=checkpoint_id)

    def _release_run(self, checkpoint_id: int) -> None:
        with self._runs_cond:
            run = self._runs.get(checkpoint_id)
            if run is not None and run.state is RunState.PENDING:
                run.cancel()
                del self._runs[checkpoint_id]

    def close(self) -> None:
        """Cancel the snapshots not started; wait for running ones (they read the env)."""
        self._closed = True
        with self._runs_cond:
            for run in self._runs.values():
                run.cancel()
            while any(r.state is RunState.RUNNING for r in self._runs.values()):
                self._runs_cond.wait()
            self._runs.clear()

    def unpin_all(self) -> None:
        """Drop every pin of this backend (closed: it takes no snapshot any more)."""
        if self._pins is not None:
            self._pins.unpin(self._owner, below=1 << 62)
