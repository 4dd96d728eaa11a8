"""Checkpoint storage on a local (or mounted) filesystem.

Layout::

    <dir>/chk-0000000042/_metadata           durable last: its presence = completed
    <dir>/chk-0000000042/<uid>-<subtask>/   files of this checkpoint only
    <dir>/shared/                           files later checkpoints build on (incremental)
    <dir>/chk-0000000041.bad/_set_aside     a checkpoint judged bad, with the reason
    <dir>/_checkpoint_ids                   highest id handed to a savepoint
    <dir>/_stop_savepoint                   the savepoint a stop-with-savepoint committed
    <dir>/_stop_savepoint.bad               ... once it proved bad, with the reason

Metadata is written to a temp file, fsynced, renamed, and the directory
fsynced: a crash leaves either no metadata or a whole one, and the checksum
catches the rest. Savepoints are self-contained directories elsewhere and are
never touched by retention.
"""

from __future__ import annotations

import datetime as dt
import errno
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import orjson

from aiostream_ckpt.checkpoint.metadata import (
    METADATA_FILE,
    CompletedCheckpoint,
    decode_metadata,
    encode_metadata,
)
from aiostream_ckpt.durable import child_path, fsync_dir
from aiostream_ckpt.errors import CheckpointError, CorruptCheckpointError
from aiostream_ckpt.state.backend import SnapshotTarget

log = logging.getLogger(__name__)
_CHK_RE = re.compile(r"^chk-(\d{10})$")
_BAD_RE = re.compile(r"^chk-(\d{10})\.bad$")
SET_ASIDE_FILE = "_set_aside"
_IDS_FILE = "_checkpoint_ids"
_STOP_SAVEPOINT_FILE = "_stop_savepoint"


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one."""
    tmp = child_path(path.parent, path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise storage_error("write", path, exc) from exc


def storage_error(what: str, path: Path, exc: OSError) -> CheckpointError:
    """Describe a failed file operation of a checkpoint (it declines; a restart may help)."""
    full = " (checkpoint storage is full)" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return CheckpointError(f"cannot {what} {path}: {exc.strerror or exc}{full}", retriable=True)


def savepoint_target(directory: Path, checkpoint_id: int, uid: str, subtask: int) -> SnapshotTarget:
    """Return where ``uid``'s instance ``subtask`` writes savepoint ``checkpoint_id``: all in it."""
    exclusive = directory / f"{uid}-{subtask}"
    try:
        exclusive.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error("create", exclusive, exc) from exc
    return SnapshotTarget(checkpoint_id, directory, exclusive, directory, is_savepoint=True)


def read_checkpoint(directory: Path) -> CompletedCheckpoint:
    """Read and verify the metadata of a checkpoint or savepoint directory."""
    path = directory / METADATA_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{directory}: no {METADATA_FILE} (not completed)") from exc
    except OSError as exc:
        raise CorruptCheckpointError(f"{path}: unreadable ({exc.strerror})") from exc
    return CompletedCheckpoint.from_json(decode_metadata(data, path), directory)


class CheckpointStorage:
    """The checkpoint directory of one job."""

    def __init__(self, root: Path, *, create: bool = True) -> None:
        """``create=False`` for readers (``checkpoints list``): nothing is written."""
        self.root = root
        self.shared_dir = root / "shared"
        #: the pins of state backends in worker processes, asked for by each retention
        #: pass after it listed the shared files (a worker pins a file before creating it)
        self.remote_pins: Callable[[], set[str]] | None = None
        if not create:
            return
        try:
            self.shared_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"cannot create checkpoint directory {root}: {exc}") from exc
        #: shared files in use outside the retained checkpoints: (owner, checkpoint id) -> files
        self._pins: dict[tuple[str, int], set[str]] = {}
        self._pins_lock = threading.Lock()

    def checkpoint_dir(self, checkpoint_id: int) -> Path:
        return child_path(self.root, f"chk-{checkpoint_id:010d}")

    def _ids_on_disk(self) -> list[int]:
        ids: list[int] = []
        if not self.root.is_dir():
            return ids
        for p in self.root.iterdir():
            m = _CHK_RE.match(p.name)
            if m and p.is_dir():
                ids.append(int(m.group(1)))
        return sorted(ids)

    def _ids_set_aside(self) -> dict[int, Path]:
        out: dict[int, Path] = {}
        for p in self.root.iterdir():
            m = _BAD_RE.match(p.name)
            if m and p.is_dir():
                out[int(m.group(1))] = p
        return out

    def next_checkpoint_id(self) -> int:
        """One more than any id this directory has seen: ids only grow, across restarts too.

        Committed output is named by checkpoint id, so an id must never come
        back: checkpoints (kept or set aside) count, and so do savepoints,
        which leave no ``chk-N`` behind (:meth:`note_savepoint_id`).
        """
        seen = [*self._ids_on_disk(), *self._ids_set_aside(), self._savepoint_high_water()]
        return max(seen, default=0) + 1

    def _savepoint_high_water(self) -> int:
        try:
            return int(orjson.loads((self.root / _IDS_FILE).read_bytes())["savepoint"])
        except FileNotFoundError:
            return 0
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{self.root / _IDS_FILE} is unreadable: {exc}") from exc

    def note_savepoint_id(self, checkpoint_id: int) -> None:
        """Remember a savepoint's id durably before its barrier goes out (rare: savepoints)."""
        if checkpoint_id > self._savepoint_high_water():
            write_atomically(self.root / _IDS_FILE, orjson.dumps({"savepoint": checkpoint_id}))

    # -- bad checkpoints ---------------------------------------------------------------

    def set_aside(self, checkpoint_id: int, reason: str) -> None:
        """Rename a checkpoint judged bad to ``chk-N.bad`` so no restart picks it again.

        Its files stay for inspection (``checkpoints list`` shows the reason);
        retention neither keeps the shared files only it references nor
        deletes the directory.
        """
        src = self.checkpoint_dir(checkpoint_id)
        dst = src.with_name(src.name + ".bad")
        note = {"reason": reason, "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
        try:
            write_atomically(src / SET_ASIDE_FILE, orjson.dumps(note))
            os.replace(src, dst)
            fsync_dir(self.root)
        except (OSError, CheckpointError) as exc:
            msg = f"cannot set aside bad checkpoint {checkpoint_id} ({src}): {exc}"
            raise CheckpointError(msg, retriable=True) from exc
        log.error("checkpoint %d set aside as %s: %s", checkpoint_id, dst.name, reason)

    def set_aside_checkpoints(self) -> dict[int, str]:
        """Checkpoint id -> why it was set aside, for every ``chk-N.bad``."""
        out: dict[int, str] = {}
        for cid, path in sorted(self._ids_set_aside().items()):
            try:
                out[cid] = str(orjson.loads((path / SET_ASIDE_FILE).read_bytes())["reason"])
            except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
                out[cid] = "(reason unreadable)"
        return out

    def committed_after(self, checkpoint_id: int) -> list[int]:
        """Ids newer than ``checkpoint_id`` whose output sinks may have committed.

        Completed checkpoints (kept or set aside) and the stop-with-savepoint's
        savepoint (kept or set aside); other savepoints commit nothing. A
        restore to ``checkpoint_id`` replays their records.
        """
        ids = {*self.completed_newest_first(), *self._ids_set_aside()}
        for name in (_STOP_SAVEPOINT_FILE, _STOP_SAVEPOINT_FILE + ".bad"):
            try:
                ids.add(int(orjson.loads((self.root / name).read_bytes())["id"]))
            except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
        return sorted(i for i in ids if i > checkpoint_id)

    # -- stop-with-savepoint -------------------------------------------------------------

    def record_stop_savepoint(self, directory: Path, checkpoint_id: int) -> None:
        """Make a stop-with-savepoint's savepoint this job's newest restore point.

        Written before its output is committed: a restart on this directory
        must then resume from the savepoint, not from an older checkpoint
        whose restore would have to retract that output.
        """
        body = {"id": checkpoint_id, "path": str(directory.resolve())}
        write_atomically(self.root / _STOP_SAVEPOINT_FILE, orjson.dumps(body))

    def stop_savepoint(self) -> tuple[int, Path] | None:
        try:
            body = orjson.loads((self.root / _STOP_SAVEPOINT_FILE).read_bytes())
            return int(body["id"]), Path(body["path"])
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            log.error("%s is unreadable (%s); ignoring it", self.root / _STOP_SAVEPOINT_FILE, exc)
            return None

    def set_aside_stop_savepoint(self, reason: str) -> None:
        """Stop restoring from the stop-with-savepoint's savepoint (it proved bad).

        The record is renamed, with the reason, not deleted; restores go back
        to the newest checkpoint, retracting the savepoint's committed output.
        """
        src = self.root / _STOP_SAVEPOINT_FILE
        try:
            body = orjson.loads(src.read_bytes())
            body["set_aside"] = reason
            write_atomically(src.with_name(src.name + ".bad"), orjson.dumps(body))
            src.unlink()
            fsync_dir(self.root)
        except FileNotFoundError:
            return
        except (OSError, orjson.JSONDecodeError, TypeError) as exc:
            raise CheckpointError(f"cannot set aside {src}: {exc}", retriable=True) from exc
        log.error("the stop-with-savepoint's savepoint %s is set aside: %s", body["path"], reason)

    def target(self, checkpoint_id: int, uid: str, subtask: int) -> SnapshotTarget:
        exclusive = child_path(self.checkpoint_dir(checkpoint_id), f"{uid}-{subtask}")
        try:
            exclusive.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage_error("create", exclusive, exc) from exc
        return SnapshotTarget(checkpoint_id, self.root, exclusive, self.shared_dir, pins=self)

    def write_completed(self, completed: CompletedCheckpoint) -> None:
        """Make ``completed``'s metadata durable in its directory (a chk-N or a savepoint's)."""
        completed.directory.mkdir(parents=True, exist_ok=True)
        write_atomically(completed.directory / METADATA_FILE, encode_metadata(completed.to_json()))

    def completed_newest_first(self) -> Iterator[int]:
        for cid in reversed(self._ids_on_disk()):
            if (self.checkpoint_dir(cid) / METADATA_FILE).exists():
                yield cid

    def read_completed(
        self, checkpoint_id: int, *, with_state: bool = False
    ) -> CompletedCheckpoint:
        """Read and verify completed checkpoint ``checkpoint_id``'s metadata.

        ``with_state``: make its state files readable below :attr:`root` too
        (here they are; an object store's copy downloads them).
        """
        return read_checkpoint(self.checkpoint_dir(checkpoint_id))

    def latest_valid(self) -> CompletedCheckpoint | None:
        """Return the newest completed checkpoint whose metadata verifies."""
        for cid in self.completed_newest_first():
            try:
                return read_checkpoint(self.checkpoint_dir(cid))
            except CorruptCheckpointError as exc:
                log.error("checkpoint %d is corrupt (%s); falling back to an older one", cid, exc)
        return None

    def discard(self, checkpoint_id: int) -> None:
        shutil.rmtree(self.checkpoint_dir(checkpoint_id), ignore_errors=True)

    # -- shared files in use -----------------------------------------------------------

    def pin(self, owner: str, checkpoint_id: int, files: Iterable[str]) -> None:
        """Keep ``files`` (relative to the root) while snapshot ``checkpoint_id`` may use them.

        A state backend pins the chain of every snapshot it takes (its base
        and its new files, each before it is written) and keeps the pin of
        the snapshot it builds on until a newer one completes: retention
        then keeps exactly what running and future snapshots reference,
        whatever the clocks say.
        """
        with self._pins_lock:
            self._pins.setdefault((owner, checkpoint_id), set()).update(files)

    def unpin(self, owner: str, *, below: int | None = None, only: int | None = None) -> None:
        """Drop ``owner``'s pins of checkpoints ``< below`` or of checkpoint ``only``."""
        with self._pins_lock:
            for key in list(self._pins):
                o, cid = key
                if o == owner and (
                    (below is not None and cid < below) or (only is not None and cid == only)
                ):
                    del self._pins[key]

    def unpin_all(self) -> None:
        """Forget every pin (a new attempt: the old backends are gone)."""
        with self._pins_lock:
            self._pins.clear()

    def _pinned(self) -> set[str]:
        with self._pins_lock:
            pinned: set[str] = set().union(*self._pins.values())
        if self.remote_pins is not None:  # asked after the local ones: see apply_retention
            pinned |= self.remote_pins()
        return pinned

    def local_pins(self) -> set[str]:
        """Return the files pinned in this process (a worker reports them to the main one)."""
        with self._pins_lock:
            return set().union(*self._pins.values())

    def discard_incomplete(self, only: int | None = None) -> None:
        """Remove directories of checkpoints that never got their metadata (crash leftovers).

        ``only``: just checkpoint ``only``'s, if it has none (a late write after its abort).
        """
        for cid in self._ids_on_disk() if only is None else [only]:
            d = self.checkpoint_dir(cid)
            if not (d / METADATA_FILE).exists():
                shutil.rmtree(d, ignore_errors=True)

    def apply_retention(self, retained: int) -> None:
        """Keep the newest ``retained`` completed checkpoints and the shared files in use.

        In use means referenced: by a retained checkpoint's metadata, or
        pinned by a snapshot in flight or by the base a backend builds its
        next snapshot on (:meth:`pin`). No clock is compared with file times:
        a process clock ahead of the filesystem's must not delete live files.
        """
        completed = list(self.completed_newest_first())
        keep = completed[:retained]
        for cid in completed[retained:]:
            self.discard(cid)
        # list before reading the pins: a file created later was pinned before it existed
        shared = list(self.shared_dir.iterdir())
        referenced = self._pinned()
        for cid in keep:
            try:
                chk = read_checkpoint(self.checkpoint_dir(cid))
            except CorruptCheckpointError:
                return  # do not garbage-collect on a state we cannot fully read
            referenced |= chk.referenced_files()
        for f in shared:
            rel = f.relative_to(self.root).as_posix()
            if rel in referenced:
                continue
            if f.is_dir():
                shutil.rmtree(f, ignore_errors=True)
            else:
                f.unlink(missing_ok=True)
