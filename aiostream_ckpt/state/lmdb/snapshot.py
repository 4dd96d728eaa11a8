r"""Snapshot files: full LMDB copies, delta files, checksums, and the incremental chain.

A *full* snapshot is ``Environment.copyfd(compact=True, txn=...)`` of the read
transaction pinned right after the snapshot's frozen write set was committed
(and before any later one): LMDB's MVCC gives the copy-on-write for free.
An *incremental* snapshot is a delta file holding, for every LMDB key changed
since the last completed checkpoint, its value as of the pinned transaction or
a delete mark. Restoring applies the chain ``full, delta, delta, ...`` in order.

Delta file format (all integers big-endian)::

    header   b"ASCKDLT\x00" | version u16 | flags u16
    record   op u8 (1 put, 2 delete) | key_len u16 | value_len u32 | key | value
    trailer  b"ASCKEND\x00" | record_count u64 | sha256(header + records)

The trailer makes a delta self-checking even without its handle; the handle's
per-file sha256 (over the whole file) is what restore verifies first.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(path.parent)
    return path.stat().st_size, sha256_file(path)


def write_delta(
    txn: lmdb.Transaction[bytes], keys: Iterable[bytes], path: Path
) -> tuple[int, str, int]:
    """Write the values of ``keys`` as seen by ``txn``; return ``(size, sha256, records)``."""
    body = hashlib.sha256()
    whole = hashlib.sha256()
    count = 0
    size = 0
    buf: list[bytes] = []
    buffered = 0
    get = txn.get
    pack = _RECORD.pack
    with path.open("xb") as f:

        def emit(data: bytes) -> None:
            nonlocal size
            body.update(data)
            whole.update(data)
            f.write(data)
            size += len(data)

        emit(_HEADER.pack(DELTA_MAGIC, DELTA_VERSION, 0))
        for key in sorted(keys):
            value = get(key)
            if value is None:
                buf.append(pack(OP_DELETE, len(key), 0))
                buf.append(key)
                buffered += 7 + len(key)
            else:
                buf.append(pack(OP_PUT, len(key), len(value)))
                buf.append(key)
                buf.append(value)
                buffered += 7 + len(key) + len(value)
            count += 1
            if buffered >= _CHUNK:
                emit(b"".join(buf))
                buf.clear()
                buffered = 0
        if buf:
            emit(b"".join(buf))
        trailer = _TRAILER.pack(TRAILER_MAGIC, count, body.digest())
        whole.update(trailer)
        f.write(trailer)
        size += len(trailer)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(path.parent)
    return size, whole.hexdigest(), count


def read_delta(path: Path, name: str) -> Iterator[tuple[int, bytes, bytes | None]]:
    """Yield ``(op, key, value)`` records of a delta file, validating its framing."""
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
    seen = 0
    while off < end:
        if off + rsize > end:
            raise CorruptCheckpointError(f"state file {name}: truncated record at {off}")
        op, klen, vlen = unpack(data, off)
        off += rsize
        key = data[off : off + klen]
        off += klen
        if op == OP_PUT:
            yield op, key, data[off : off + vlen]
            off += vlen
        elif op == OP_DELETE:
            yield op, key, None
        else:
            raise CorruptCheckpointError(f"state file {name}: unknown record op {op}")
        seen += 1
    if off != end or seen != count:
        raise CorruptCheckpointError(f"state file {name}: {seen} records, trailer says {count}")


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


@dataclass(slots=True, eq=False)
class PendingSnapshot:
    """A snapshot taken but not yet completed: its chain and the changes it sealed."""

    checkpoint_id: int
    changes: set[bytes]  # filled when its write set is applied, read only after that
    savepoint: bool
    chain: list[dict[str, Any]] | None = None  # set by the async part when it finishes
    usable: bool = True  # False once aborted: its changes still count, its files do not


@dataclass(slots=True)
class ChangeTracker:
    """Which LMDB keys changed since the last completed checkpoint.

    Every epoch (the writes between two barriers) has one change set: writes
    flushed early (cache eviction) record into ``epoch``, and the barrier seals
    it into a :class:`PendingSnapshot` whose frozen write set, applied later,
    records into the same set. A delta holds the union of every pending epoch
    (all of them are newer than the base), so an aborted checkpoint's changes
    are simply carried into the next delta; completing checkpoint ``n`` makes
    its chain the base and drops every pending epoch up to ``n``. The backend
    applies write sets in barrier order under its write lock, so when snapshot
    ``n``'s own write set has been applied, the sets of every epoch up to ``n``
    are final and its thread can read them without locks.
    """

    full_every: int
    epoch: set[bytes] = field(default_factory=set)
    pending: dict[int, PendingSnapshot] = field(default_factory=dict)
    base_id: int | None = None
    base_chain: list[dict[str, Any]] | None = None

    def sink(self) -> set[bytes] | None:
        """Return the change set of the current epoch, or None when no delta can need it.

        None when there is no base and no pending snapshot that could become one.
        """
        if self.full_every <= 1 or (self.base_chain is None and not self.pending):
            self.epoch.clear()
            return None
        return self.epoch

    def begin(
        self, checkpoint_id: int, savepoint: bool
    ) -> tuple[PendingSnapshot, set[bytes] | None, bool, list[dict[str, Any]], list[set[bytes]]]:
        """Seal the epoch.

        Returns ``(pending, sink for the epoch's frozen write set, full?, base
        chain, change sets for a delta)``; the change sets fill up as earlier
        write sets are applied.
        """
        sink = self.sink()
        base = self.base_chain
        full = savepoint or base is None or len(base) >= self.full_every
        sealed, self.epoch = self.epoch, set()
        sets = [p.changes for p in self.pending.values()]
        sets.append(sealed)
        pending = PendingSnapshot(checkpoint_id, sealed, savepoint)
        self.pending[checkpoint_id] = pending
        return pending, sink, full, list(base or ()), sets

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
