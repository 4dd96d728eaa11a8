"""Working-state directories: one per job attempt, claimed by a lock, swept when orphaned.

Each attempt keeps its working LMDB copies in a fresh ``aiostream-state-*``
directory under ``state.local_dir`` (the system temp dir by default) and
removes it when the attempt ends. A process killed with SIGKILL (or an OOM
kill, a power cut) cannot remove it, and its restart makes a new one: the
old copy, as big as the whole state, stays on disk, once per crash. So the
directory holds an ``flock`` on its ``.owner`` file for as long as the
attempt runs (the kernel drops it when the process dies, however it dies),
and claiming a new directory first removes every sibling whose lock nobody
holds. Directories of other jobs sharing the root, still running, keep their
locks and are left alone; so is a directory without an owner file (made by
an older version, or just being claimed): nothing tells whether it is in use.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
from pathlib import Path

from aiostream_ckpt.errors import StateError

log = logging.getLogger(__name__)

PREFIX = "aiostream-state-"
OWNER = ".owner"


class LocalStateDir:
    """A claimed working-state directory; :meth:`release` unlocks and deletes it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Delete the directory, then drop the lock (idempotent)."""
        if self._fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)
        self._fd = None


def claim(root: Path) -> LocalStateDir:
    """Sweep orphaned siblings under ``root``, then make and lock a new directory there."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        sweep(root)
        path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=root))
        fd = os.open(path / OWNER, os.O_CREAT | os.O_RDWR, 0o600)
    except OSError as exc:
        raise working_state_error(root, exc) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise StateError(f"cannot lock the new working-state directory {path}: {exc}") from exc
    try:
        os.write(fd, str(os.getpid()).encode())
    except OSError as exc:
        os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        raise working_state_error(path, exc) from exc
    return LocalStateDir(path, fd)


def working_state_error(path: Path, exc: OSError) -> StateError:
    """Describe working state that cannot be written: retriable, space may be freed meanwhile."""
    return StateError(
        f"cannot create working state in {path}: {exc.strerror or exc} "
        "(state.local_dir is full or not writable)",
        retriable=True,
    )


def sweep(root: Path) -> list[Path]:
    """Remove the working-state directories under ``root`` that no live process holds."""
    removed = []
    for path in sorted(root.glob(PREFIX + "*")):
        if path.is_dir() and _orphaned(path):
            size = _disk_bytes(path)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            log.warning(
                "removed %s: working state left by a process that died (%.1f MB)",
                path,
                size / 1e6,
            )
    return removed


def _orphaned(path: Path) -> bool:
    try:
        fd = os.open(path / OWNER, os.O_RDWR)
    except OSError:
        return False  # no owner file (yet): cannot tell, leave it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: its process is alive
    finally:
        os.close(fd)  # closing drops a lock we took
    return True


def _disk_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total
