"""Frozen write sets on their way into the working LMDB: encoded, then applied, in order.

A write set (every state's frozen writes of one epoch, or of one early flush)
goes through two steps, each strictly in barrier/flush order:

1. *encode*: the states turn it into records, the exact LMDB keys and value
   bytes (or delete marks) it writes (:meth:`KeyedStateBase.encode`). They go
   into the write set's own :class:`ChangeLog` and into its epoch's, which is
   the next delta's content. A snapshot needs its own write set and every
   earlier one encoded, no more: a delta is written from the records, and a
   full snapshot copies the view committed at that moment and adds, as a
   *tail* delta, the records of every write set up to its own not yet applied
   in that view.
2. *apply*: one write transaction per write set puts its records into LMDB
   and commits. Eviction needs everything applied (then every cache entry is
   clean); a snapshot does not wait for it: the task applies its write set
   after the snapshot was acknowledged (``settle``). A full snapshot whose
   own write set gets applied before it took a view pins the view right after
   that commit, before any later write set is applied (no tail then).

Both steps run on the event loop thread in slices (see
:mod:`~aiostream_ckpt.state.lmdb.backend` for why), and several drivers
(snapshots' ``prepare``/``settle``, a flush) may take turns: each takes the
next slice of the same queue, so every write set is encoded once and applied
once, in order. A write set being applied stays in one open write transaction
across slices. An error in a slice throws that step's work away (the encode
staging, or the open transaction) and leaves the write set queued as it was,
so nothing is lost or reordered and the next driver meets the same error.

Encoding a write set that clears map entries reads the LMDB view (a clear is a
prefix delete, logged key by key), so every earlier write set is applied
first; such write sets are rare.
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import lmdb

from aiostream_ckpt.state.lmdb.snapshot import ChangeLog
from aiostream_ckpt.state.lmdb.states import KeyedStateBase


class RunState(enum.Enum):
    """Lifecycle of one asynchronous snapshot part: PENDING → RUNNING → DONE, or → CANCELLED."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"


_LIVE = (RunState.PENDING, RunState.RUNNING)


class SnapshotRun:
    """One snapshot's async part: its state, and for a full snapshot its pinned view and tail."""

    __slots__ = ("cond", "label", "state", "tail", "txn", "wants_view")

    def __init__(self, cond: threading.Condition, label: str) -> None:
        self.txn: lmdb.Transaction[bytes] | None = None
        #: False once the snapshot turned out to copy nothing (its state did not change)
        self.wants_view = True
        #: records of the write sets up to this snapshot's own not yet in ``txn``'s view
        self.tail: list[ChangeLog] = []
        self.cond = cond
        self.label = label
        self.state = RunState.PENDING

    def pin(self, env: lmdb.Environment, tail: list[ChangeLog]) -> None:
        """Pin the current view (on the event loop) unless pinned already or cancelled."""
        with self.cond:
            if self.txn is None and self.wants_view and self.state in _LIVE:
                self.txn = env.begin(buffers=False)
                self.tail = tail

    def drop_view(self) -> None:
        """Release the pinned view, and pin none later: the snapshot copies nothing."""
        with self.cond:
            self.wants_view = False
            self._release()

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
        self.tail = []
        if self.txn is not None:
            self.txn.abort()
            self.txn = None


@dataclass(slots=True, eq=False)
class WriteSet:
    """Frozen write sets of every state for one epoch or one flush."""

    seq: int  # barrier/flush order: write sets are encoded and applied strictly in it
    parts: list[tuple[KeyedStateBase, Any]]  # dropped once encoded
    changes: ChangeLog | None  # the epoch's log, for deltas (None: no delta can need it)
    run: SnapshotRun | None  # a full snapshot to pin right after this commit, if not yet
    needs_view: bool  # encoding it reads LMDB (map clears): apply the earlier ones first
    records: ChangeLog = field(default_factory=ChangeLog)  # filled when encoded


@dataclass(slots=True, eq=False)
class _Step:
    """A write set's encoding or application, interrupted between two slices."""

    ws: WriteSet
    slices: Generator[int, None, None]
    staged: ChangeLog | None = None  # encoding: records, moved to the write set when done
    txn: lmdb.Transaction[bytes] | None = None  # applying: the open write transaction


class WriteQueue:
    """The write sets not yet applied, oldest first; the first ``encoded`` of them are encoded.

    On the event loop only. ``env`` and ``view`` are read when needed (a
    restore replaces the environment before anything is queued); ``view``
    gives the current committed view, for encoding map clears; ``on_commit`` is
    called after every commit.
    """

    def __init__(
        self,
        env: Callable[[], lmdb.Environment],
        view: Callable[[], lmdb.Transaction[bytes]],
        slice_keys: int,
        on_commit: Callable[[], None],
    ) -> None:
        self._env = env
        self._view = view
        self._on_commit = on_commit
        self.slice_keys = slice_keys
        self._queue: deque[WriteSet] = deque()
        self._seq = 0
        self.encoded = 0
        self.encoded_seq = 0  # every write set up to this seq is encoded
        self.applied_seq = 0  # every write set up to this seq is applied
        self._encoding: _Step | None = None
        self._applying: _Step | None = None

    def __len__(self) -> int:
        return len(self._queue)

    def enqueue(
        self,
        parts: list[tuple[KeyedStateBase, Any]],
        changes: ChangeLog | None,
        run: SnapshotRun | None,
    ) -> int:
        """Queue frozen write sets behind every earlier one; return their seq."""
        self._seq += 1
        needs_view = any(state.needs_view(frozen) for state, frozen in parts)
        self._queue.append(WriteSet(self._seq, parts, changes, run, needs_view))
        return self._seq

    def unapplied_records(self, through: int) -> list[ChangeLog]:
        """Return the records of the write sets up to ``through`` not applied yet (encoded)."""
        return [ws.records for ws in self._queue if ws.seq <= through]

    # -- slices -------------------------------------------------------------------------
    def encode_slice(self) -> int:
        """Encode one slice of the first write set not yet encoded; return the keys done.

        When that write set needs the LMDB view, apply a slice of an earlier
        one instead. Returns 0 when a write set is finished, or there is none.
        """
        step = self._encoding
        if step is None:
            if self.encoded >= len(self._queue):
                return 0
            ws = self._queue[self.encoded]
            if ws.needs_view and self.encoded > 0:
                return self.apply_slice()  # its prefix scans must see every earlier write
            staged = ChangeLog()
            step = self._encoding = _Step(ws, self._encode_parts(ws, staged), staged=staged)
        try:
            n = next(step.slices, -1)
        except BaseException:
            self._encoding = None
            step.slices.close()
            raise
        if n >= 0:
            return n
        self._encoding = None
        ws = step.ws
        assert step.staged is not None
        ws.records = step.staged
        ws.parts = []  # the records are all that is needed from now on
        if ws.changes is not None:
            ws.changes.extend(ws.records)
        self.encoded += 1
        self.encoded_seq = ws.seq
        return 0

    def _encode_parts(self, ws: WriteSet, log: ChangeLog) -> Generator[int, None, None]:
        for state, frozen in ws.parts:
            yield from state.encode(frozen, log, self.slice_keys, self._view)

    def apply_slice(self) -> int:
        """Apply one slice of the oldest write set (it must be encoded); return records done.

        The last slice commits, drops the write set and pins the view of a full
        snapshot waiting for this one. Returns 0 when a write set is finished or
        nothing encoded is left to apply.
        """
        step = self._applying
        if step is None:
            if not self.encoded:
                return 0
            ws = self._queue[0]
            if not ws.records.batches:  # nothing to write: no transaction
                self._applied(ws)
                return 0
            txn = self._env().begin(write=True)
            step = self._applying = _Step(ws, _put(txn, ws.records, self.slice_keys), txn=txn)
        assert step.txn is not None
        try:
            n = next(step.slices, -1)
            if n >= 0:
                return n
            step.txn.commit()
        except BaseException:
            self._applying = None
            step.slices.close()
            step.txn.abort()
            raise
        self._applying = None
        self._on_commit()  # the owner's read view must not pin the pages this freed
        self._applied(step.ws)
        return 0

    def _applied(self, ws: WriteSet) -> None:
        self._queue.popleft()
        self.encoded -= 1
        self.applied_seq = ws.seq
        if ws.run is not None:
            ws.run.pin(self._env(), [])

    def step(self) -> int:
        """Do one slice of what comes next: apply when something encoded waits, else encode."""
        if self.encoded:
            return self.apply_slice()
        return self.encode_slice()

    def drain(self) -> int:
        """Encode and apply everything queued, without yielding; return the work done."""
        n = 0
        while self._queue:
            n += self.step()
        return n

    def abort(self) -> None:
        """Drop everything (the working copy is being deleted): abort an open transaction."""
        for step in (self._encoding, self._applying):
            if step is not None:
                step.slices.close()
                if step.txn is not None:
                    step.txn.abort()
        self._encoding = self._applying = None
        self._queue.clear()
        self.encoded = 0


def _put(
    txn: lmdb.Transaction[bytes], records: ChangeLog, slice_keys: int
) -> Generator[int, None, None]:
    """Write a change log's records into ``txn`` in order, yielding every ``slice_keys``.

    Every record list is all puts or all deletes (see :class:`ChangeLog`).
    """
    cur = txn.cursor()
    delete = txn.delete
    done = 0
    for _state, _unique, lists in records.batches:
        for records_list in lists:
            if not records_list:
                continue
            if records_list[0][1] is None:
                for key, _ in records_list:
                    delete(key)
                done += len(records_list)
            elif len(records_list) <= slice_keys:
                cur.putmulti(records_list)  # type: ignore[arg-type]  # all puts
                done += len(records_list)
            else:
                for i in range(0, len(records_list), slice_keys):
                    chunk = records_list[i : i + slice_keys]
                    cur.putmulti(chunk)  # type: ignore[arg-type]  # all puts
                    done += len(chunk)
                    if done >= slice_keys:
                        yield done
                        done = 0
            if done >= slice_keys:
                yield done
                done = 0
    if done:
        yield done
