"""A savepoint's own copy of the pre-committed output it lists.

Why: a savepoint triggered while the job runs does not commit (Flink 1.15+
does not either: an intermediate savepoint has no side effects); its
pre-committed transactions stay pending until the next checkpoint commits
them. If the job dies first, the restart restores the checkpoint before the
savepoint and aborts them, and the savepoint, which its caller was told is
complete, would list output that no longer exists. Flink keeps what a
savepoint refers to until the savepoint is disposed; here the savepoint holds
a copy of it, inside its own directory, so it stays self-contained (it can be
moved, and disposing of it is removing it).

For the file sinks the copy is a hard link to the pre-committed file (a
pending file never changes again, nor does the committed file it is renamed
to), a byte copy where the savepoint is on another filesystem. Layout::

    <savepoint>/<uid>-<subtask>/held-<key>/part-0000000007-0003.jsonl

and the writer state in the savepoint names each copy (``"held"``: staged
name, path relative to the savepoint, size, sha256). A restore of the
savepoint that finds a listed file neither staged nor committed brings the
copy back under its staged name and commits it as usual.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiostream_ckpt.durable import child_path, fsync_dir

#: The writer state's key for the copies.
HELD_KEY = "held"

#: Errors of ``os.link`` that a byte copy works around (another filesystem, no links).
_NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK})


@dataclass(frozen=True, slots=True)
class HeldCopy:
    """The savepoint's copy of one pre-committed file."""

    staged: str
    #: relative to the savepoint directory
    path: str
    size: int
    sha256: str

    def to_state(self) -> list[Any]:
        return [self.staged, self.path, self.size, self.sha256]

    @classmethod
    def from_state(cls, entry: Sequence[Any]) -> HeldCopy:
        return cls(str(entry[0]), str(entry[1]), int(entry[2]), str(entry[3]))


def copies_of(state: Mapping[str, Any] | None) -> dict[str, HeldCopy]:
    """Staged name -> its copy, as a (restored) writer state lists them."""
    return {c.staged: c for c in map(HeldCopy.from_state, (state or {}).get(HELD_KEY, []))}


def merge_copies(states: Iterable[Mapping[str, Any] | None]) -> list[list[Any]]:
    """Union the copies of several old writers' states (restore at another parallelism)."""
    merged: dict[str, list[Any]] = {}
    for state in states:
        for staged, copy in copies_of(state).items():
            merged.setdefault(staged, copy.to_state())
    return list(merged.values())


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _link_or_copy(src: Path, dst: Path) -> None:
    """Make ``dst`` hold ``src``'s bytes: a hard link, else a fsynced copy under a temp name."""
    try:
        os.link(src, dst)
        return
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
    tmp = child_path(dst.parent, f".{dst.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
            fout.flush()
            os.fsync(fout.fileno())
        os.rename(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def keep_copy(candidates: Sequence[Path], dst: Path, root: Path, staged: str) -> HeldCopy:
    """Hold the first of ``candidates`` that exists at ``dst`` (inside the savepoint ``root``).

    The candidates are one file under its staged, then its committed name: a
    commit running meanwhile may have renamed it. Raises FileNotFoundError
    when none exists. Not durable until :func:`fsync_dir` of ``dst.parent``.
    """
    for src in candidates:
        try:
            _link_or_copy(src, dst)
        except FileNotFoundError:
            continue
        except FileExistsError:  # a retried savepoint of the same id (never: ids grow)
            dst.unlink()
            _link_or_copy(src, dst)
        return HeldCopy(
            staged, dst.relative_to(root).as_posix(), dst.stat().st_size, sha256_of(dst)
        )
    raise FileNotFoundError(errno.ENOENT, f"none of {', '.join(str(c) for c in candidates)} exists")


def unusable(root: Path, copy: HeldCopy, *, verify: bool) -> str | None:
    """Why the copy cannot stand in for its file (None: it can); ``verify`` checks its sha256."""
    path = root / copy.path
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"its savepoint copy {path} is missing"
    if size != copy.size:
        return f"its savepoint copy {path} has {size} bytes, not {copy.size}"
    if verify and sha256_of(path) != copy.sha256:
        return f"its savepoint copy {path} does not match its sha256"
    return None


def put_back(copy: Path, directory: Path, staged: str) -> None:
    """Bring a savepoint's copy back into ``directory`` as the pre-committed file ``staged``."""
    dst = child_path(directory, staged)
    try:
        _link_or_copy(copy, dst)
    except FileExistsError:  # another writer of a rescaled job put it back first
        return
    fsync_dir(directory)
