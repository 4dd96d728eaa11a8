r"""Snapshot files: full LMDB copies, delta files, checksums, and the incremental chain.

A *full* snapshot is ``Environment.copyfd(compact=True, txn=...)`` of a read
transaction pinned on the working LMDB (LMDB's MVCC gives the copy-on-write
for free), plus a *tail* delta with the records of the write sets up to the
snapshot's own that were not applied in that view yet (see
:mod:`~aiostream_ckpt.state.lmdb.writes`); the tail is marked ``"tail": true``
in the chain and counts as part of the full snapshot. An *incremental*
snapshot is a delta file holding, for every LMDB key changed since the last
completed checkpoint, its value at the snapshot's barrier or a delete mark.
Restoring applies the chain ``full, delta, delta, ...`` in order. Deltas are
written from the :class:`ChangeLog` records (the exact bytes each encoded write
set puts, or a delete), not read back from LMDB: the newest record of a key is
its value at the barrier, because every write between the base and the barrier
was recorded. Each key appears once per file; records come per state, in the
order they were encoded (in key-group order for big write sets, not sorted:
see :meth:`~aiostream_ckpt.state.lmdb.states.KeyedStateBase.encode`).

Delta file format (all integers big-endian)::

    header   b"ASCKDLT\x00" | version u16 | flags u16
    record   op u8 (1 put, 2 delete) | key_len u16 | value_len u32 | key | value
    trailer  b"ASCKEND\x00" | record_count u64 | sha256(header + records)

The trailer makes a delta self-checking even without its handle; the handle's
per-file sha256 (over the whole file) is what restore verifies first. (A
columnar layout, lengths as arrays and keys/values joined, was measured: no
faster to write, 30 % faster to read; not worth a second format.)
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiostream_ckpt import failpoints
from aiostream_ckpt.durable import fsync_dir
from aiostream_ckpt.errors import CorruptCheckpointError

if TYPE_CHECKING:
    import lmdb

DELTA_MAGIC = b"ASCKDLT\x00"
TRAILER_MAGIC = b"ASCKEND\x00"
DELTA_VERSION = 1
OP_PUT = 1
OP_DELETE = 2

_HEADER = struct.Struct(">8sHH")
_RECORD = struct.Struct(">BHI")
_TRAILER = struct.Struct(">8sQ32s")
_CHUNK = 1 << 20
_BATCH = 1 << 14  # records per write() of a delta


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def write_full(env: lmdb.Environment, txn: lmdb.Transaction[bytes], path: Path) -> tuple[int, str]:
    """Copy the view of ``txn`` to ``path`` (compacted, fsynced); return ``(size, sha256)``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        env.copyfd(fd, compact=True, txn=txn)
        failpoints.hit("snapshot_write")
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(path.parent)
    return path.stat().st_size, sha256_file(path)


@dataclass(slots=True, eq=False)
class PackedDelta:
    """A delta's records packed into its file format (without header and trailer)."""

    chunks: list[bytes] = field(default_factory=list)
    records: int = 0


def pack_delta(logs: Sequence[ChangeLog], out: PackedDelta) -> Iterator[int]:
    """Pack the newest record of each key in ``logs`` into ``out``, yielding records done.

    A generator, so that the event loop can pack a big delta in slices (a
    worker thread would compete with it for the GIL; see ``write_delta``).
    """
    pack = _RECORD.pack
    put, delete = OP_PUT, OP_DELETE
    for batch in merge_logs(logs):
        for i in range(0, len(batch), _BATCH):
            chunk = batch[i : i + _BATCH]
            out.chunks.append(
                b"".join(
                    [
                        pack(put, len(k), len(v)) + k + v
                        if v is not None
                        else pack(delete, len(k), 0) + k
                        for k, v in chunk
                    ]
                )
            )
            out.records += len(chunk)
            yield len(chunk)


def write_packed_delta(delta: PackedDelta, path: Path) -> tuple[int, str, int]:
    """Write a packed delta as a file (fsynced); return ``(size, sha256, records)``.

    Only C-level work that releases the GIL for whole buffers (writes,
    hashing, fsync): this is what a worker thread does well.
    """
    header = _HEADER.pack(DELTA_MAGIC, DELTA_VERSION, 0)
    body = hashlib.sha256(header)
    size = len(header)
    with path.open("xb") as f:
        f.write(header)
        for chunk in delta.chunks:
            body.update(chunk)
            f.write(chunk)
            size += len(chunk)
        failpoints.hit("snapshot_write")  # the body is written, the trailer is not
        trailer = _TRAILER.pack(TRAILER_MAGIC, delta.records, body.digest())
        whole = body.copy()  # sha256 of the whole file without hashing the body twice
        whole.update(trailer)
        f.write(trailer)
        size += len(trailer)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(path.parent)
    return size, whole.hexdigest(), delta.records


def write_delta(logs: Sequence[ChangeLog], path: Path) -> tuple[int, str, int]:
    """Write the newest record of each key in ``logs``; return ``(size, sha256, records)``."""
    delta = PackedDelta()
    for _ in pack_delta(logs, delta):
        pass
    return write_packed_delta(delta, path)


def read_delta(path: Path, name: str) -> list[list[Record]]:
    """Return a delta file's records as ``[puts, deletes]``, validating its framing.

    Records are ``(key, value or None)``. A delta holds each key once, so its
    puts and deletes commute and may be written apart.
    """
    data = path.read_bytes()
    hsize, tsize = _HEADER.size, _TRAILER.size
    if len(data) < hsize + tsize:
        raise CorruptCheckpointError(f"state file {name} is truncated")
    magic, version, _flags = _HEADER.unpack_from(data)
    if magic != DELTA_MAGIC or version != DELTA_VERSION:
        raise CorruptCheckpointError(f"state file {name} is not a version-1 delta file")
    tmagic, count, digest = _TRAILER.unpack_from(data, len(data) - tsize)
    end = len(data) - tsize
    if tmagic != TRAILER_MAGIC or hashlib.sha256(data[:end]).digest() != digest:
        raise CorruptCheckpointError(f"state file {name} failed its internal checksum")
    off = hsize
    unpack = _RECORD.unpack_from
    rsize = _RECORD.size
    put, delete = OP_PUT, OP_DELETE
    puts: list[Record] = []
    deletes: list[Record] = []
    append = puts.append
    try:
        while off < end:
            op, klen, vlen = unpack(data, off)
            off += rsize
            kend = off + klen
            if op == put:
                vend = kend + vlen
                append((data[off:kend], data[kend:vend]))
                off = vend
            elif op == delete:
                deletes.append((data[off:kend], None))
                off = kend
            else:
                raise CorruptCheckpointError(f"state file {name}: unknown record op {op}")
    except struct.error:
        raise CorruptCheckpointError(f"state file {name}: truncated record at {off}") from None
    n = len(puts) + len(deletes)
    if off != end or n != count:
        raise CorruptCheckpointError(f"state file {name}: {n} records, trailer says {count}")
    return [puts, deletes]


def verify_file(root: Path, entry: dict[str, Any]) -> Path:
    """Check a chain file's size and sha256 against its handle entry; return its path."""
    rel = entry["path"]
    path = root / rel
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CorruptCheckpointError(f"state file {rel} is missing") from None
    if size != entry["size"]:
        raise CorruptCheckpointError(
            f"state file {rel} has {size} bytes, the handle says {entry['size']}"
        )
    if sha256_file(path) != entry["sha256"]:
        raise CorruptCheckpointError(f"state file {rel} failed its sha256 checksum")
    return Path(path)


#: One LMDB write: ``(key, value)``, value None for a delete.
Record = tuple[bytes, bytes | bytearray | None]
Put = tuple[bytes, bytes | bytearray]


class ChangeLog:
    """LMDB writes (of one write set, or of one epoch), in order, as batches of records.

    Each entry is one encoding of one state's write set: its state name,
    whether its keys are unique, and its record lists, each all puts or all
    deletes (so that they can be written with one ``putmulti``), in the order
    they must be written. Entries of different states never share a key (the
    name is part of it), so a state encoded once per epoch with unique keys --
    the common case -- is written to a delta as is; only a state encoded more
    than once (early flushes) or with repeated keys (map clears) is merged, the
    newest record of a key winning.
    """

    __slots__ = ("batches",)

    def __init__(self) -> None:
        self.batches: list[tuple[str, bool, tuple[Sequence[Record], ...]]] = []

    def add(self, state: str, *records: Sequence[Record], unique: bool = True) -> None:
        """Log one encoding of ``state``; unique means no key is in its records twice."""
        if any(records):
            self.batches.append((state, unique, records))

    def clear(self) -> None:
        self.batches.clear()

    def extend(self, other: ChangeLog) -> None:
        """Append what ``other`` logged (a write set's records, once it is encoded whole)."""
        self.batches.extend(other.batches)


def merge_logs(logs: Sequence[ChangeLog]) -> Iterator[Sequence[Record]]:
    """Yield batches holding the newest record of every key written in ``logs`` (oldest first)."""
    per_state: dict[str, list[tuple[bool, tuple[Sequence[Record], ...]]]] = {}
    for log in logs:
        for state, unique, lists in log.batches:
            per_state.setdefault(state, []).append((unique, lists))
    for entries in per_state.values():
        if len(entries) == 1 and entries[0][0]:
            yield from entries[0][1]
        else:
            merged: dict[bytes, bytes | bytearray | None] = {}
            for _, lists in entries:
                for records in lists:
                    merged.update(records)
            yield list(merged.items())


@dataclass(slots=True, eq=False)
class PendingSnapshot:
    """A snapshot taken but not yet completed: its chain and the changes it sealed."""

    checkpoint_id: int
    changes: ChangeLog  # filled when its write set is encoded, read only after that
    savepoint: bool
    chain: list[dict[str, Any]] | None = None  # set by the async part when it finishes
    usable: bool = True  # False once aborted: its changes still count, its files do not


@dataclass(slots=True)
class ChangeTracker:
    """Which LMDB keys changed since the last completed checkpoint, and to what.

    Every epoch (the writes between two barriers) has one change log: writes
    flushed early (cache eviction) record into ``epoch``, and the barrier seals
    it into a :class:`PendingSnapshot` whose frozen write set, encoded later,
    records into the same log. A delta holds the union of every pending epoch
    (all of them are newer than the base), so an aborted checkpoint's changes
    are simply carried into the next delta; completing checkpoint ``n`` makes
    its chain the base and drops every pending epoch up to ``n``. The backend
    encodes write sets in barrier order on the event loop, so when snapshot
    ``n``'s own write set has been encoded, the logs of every epoch up to ``n``
    are final and its thread can read them without locks.
    """

    full_every: int
    #: a full snapshot once the chain's deltas outweigh this fraction of its full
    #: file (0: never): restore parses every delta record in Python, the full
    #: file is a C-level copy, so this bounds restore time at any cadence
    max_delta_ratio: float = 0.5
    epoch: ChangeLog = field(default_factory=ChangeLog)
    pending: dict[int, PendingSnapshot] = field(default_factory=dict)
    base_id: int | None = None
    base_chain: list[dict[str, Any]] | None = None

    def sink(self) -> ChangeLog | None:
        """Return the change log of the current epoch, or None when no delta can need it.

        None when there is no base and no pending snapshot that could become one.
        """
        if self.full_every <= 1 or (self.base_chain is None and not self.pending):
            self.epoch.clear()
            return None
        return self.epoch

    def begin(
        self, checkpoint_id: int, savepoint: bool
    ) -> tuple[PendingSnapshot, ChangeLog | None, bool, list[dict[str, Any]], list[ChangeLog]]:
        """Seal the epoch.

        Returns ``(pending, sink for the epoch's frozen write set, full?, base
        chain, change logs for a delta, oldest first)``; the logs fill up as
        earlier write sets are encoded.
        """
        sink = self.sink()
        base = self.base_chain
        # a full snapshot's tail delta is part of it: count snapshots, not files
        full = (
            savepoint
            or base is None
            or sum(1 for e in base if not e.get("tail")) >= self.full_every
            or self._deltas_outweigh_base(base)
        )
        sealed, self.epoch = self.epoch, ChangeLog()
        sets = [p.changes for p in self.pending.values()]
        sets.append(sealed)
        pending = PendingSnapshot(checkpoint_id, sealed, savepoint)
        self.pending[checkpoint_id] = pending
        return pending, sink, full, list(base or ()), sets

    def _deltas_outweigh_base(self, chain: list[dict[str, Any]]) -> bool:
        if self.max_delta_ratio <= 0:
            return False
        full = sum(int(e.get("size", 0)) for e in chain if e.get("kind") == "full")
        deltas = sum(int(e.get("size", 0)) for e in chain if e.get("kind") == "delta")
        return deltas > self.max_delta_ratio * full

    def restored(self, checkpoint_id: int, chain: list[dict[str, Any]]) -> None:
        """Make a restored checkpoint's chain the base: changes are logged from now on."""
        if self.base_chain is None and not self.pending:
            self.base_id, self.base_chain = checkpoint_id, list(chain)

    def forget_base(self) -> None:
        """Build on no checkpoint: the next snapshot is a full one."""
        self.base_id = self.base_chain = None

    def complete(self, checkpoint_id: int) -> None:
        p = self.pending.get(checkpoint_id)
        if p is None or not p.usable or p.chain is None or p.savepoint:
            return  # a savepoint never becomes a base: it lives in its own directory
        self.base_id, self.base_chain = checkpoint_id, p.chain
        for cid in [c for c in self.pending if c <= checkpoint_id]:
            del self.pending[cid]

    def abort(self, checkpoint_id: int) -> None:
        p = self.pending.get(checkpoint_id)
        if p is not None:
            p.usable = False
