"""One owner per directory: an OS lock that a running job holds on what it writes.

Two processes on one checkpoint directory (a supervisor and a person restarting
a killed job at the same moment) both restore the same checkpoint, pick the
same next checkpoint ids and staged file names, and overwrite each other's
output. So a job locks, before it restores or writes anything, its checkpoint
directory and the output directories of its sinks and dead-letter writers, and
holds the locks until it ends.

The lock is ``flock`` on :data:`LOCK_FILE` inside the directory, not a pid
file: the kernel drops it when its process dies, kill -9 included, so a dead
owner never blocks its successor and a live one is never mistaken for dead.
The owner (pid, host, since, job) is written into the file after locking, so a
refused start can say who holds it. ``flock`` locks belong to an open file, so
a second job in the same process is refused as well, and one that locks the
same directory twice would be refused by itself: :class:`DirectoryLocks`
takes each directory once (and none inside one it already holds).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson

from aiostream_ckpt.connectors.base import DirectoryOutput
from aiostream_ckpt.errors import DirectoryOwnedError
from aiostream_ckpt.jobspec.graph import JobSpec, TransformKind

log = logging.getLogger(__name__)

#: Hidden, so that Spark, the validator and the sinks' recovery skip it.
LOCK_FILE = ".aiostream-owner.lock"


@dataclass(frozen=True)
class OwnedDirectory:
    path: Path
    #: what the directory is to the job, for the refusal ("checkpoint directory", ...)
    role: str


class DirectoryLocks:
    """The locks of one job; a re-entrant context manager.

    ``acquire`` takes every lock or none: when one directory is owned by
    another process, those already taken are released and
    :class:`~aiostream_ckpt.errors.DirectoryOwnedError` names the owner.
    Re-entrant, so the daemon can hold them from before its REST server starts
    while the runner inside takes them too: the locks go when the outermost
    holder releases them.
    """

    def __init__(self, job_name: str, directories: Iterable[OwnedDirectory]) -> None:
        self.job_name = job_name
        self.directories = _outermost(directories)
        #: (lock file descriptor, directory, whether locking created the directory)
        self._held: list[tuple[int, Path, bool]] = []
        self._depth = 0
        self._leave_no_trace = False

    @property
    def held(self) -> bool:
        return self._depth > 0

    def acquire(self) -> None:
        if self._depth:
            self._depth += 1
            return
        owner = orjson.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "job": self.job_name,
            }
        )
        try:
            for d in self.directories:
                self._held.append(_lock(d, owner))
        except BaseException:
            self._leave_no_trace = True
            self._unlock()
            raise
        self._depth = 1

    def leave_no_trace(self) -> None:
        """On release, remove the directories locking created if nothing else went into them.

        For a start refused after locking (its checkpoints belong to another
        job): it must not leave an empty output directory behind.
        """
        self._leave_no_trace = True

    def release(self) -> None:
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0:
            self._unlock()

    def _unlock(self) -> None:
        held, self._held = self._held, []
        no_trace, self._leave_no_trace = self._leave_no_trace, False
        for fd, path, created in held:
            # unlinked while still locked: a process that opened it meanwhile was refused
            empty = no_trace and created and os.listdir(path) == [LOCK_FILE]
            try:
                if empty:
                    (path / LOCK_FILE).unlink()
                os.ftruncate(fd, 0)  # no owner any more; the kernel drops the lock on close
            finally:
                os.close(fd)
            if empty:
                with contextlib.suppress(OSError):  # someone else's files arrived meanwhile
                    path.rmdir()

    def __enter__(self) -> DirectoryLocks:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def job_directories(spec: JobSpec) -> list[OwnedDirectory]:
    """List what a job writes: its checkpoints, its sinks' and dead letters' output.

    Its working state needs no lock of its own: by default it is inside the
    checkpoint directory, and each attempt claims (and locks) its own
    directory in ``state.local_dir`` (:mod:`aiostream_ckpt.state.local_dirs`).
    """
    config = spec.config
    checkpoints = config.checkpoint_dir()
    assert checkpoints is not None
    dirs = [OwnedDirectory(checkpoints, "checkpoint directory")]
    dead_letters = config.dead_letter_dir()
    if dead_letters is not None:  # writers of sources and process functions, one subdir each
        dirs.append(OwnedDirectory(dead_letters, "dead-letter directory (errors.dead_letter_dir)"))
    for t in spec.transformations:
        if t.kind is TransformKind.SINK and isinstance(t.fn, DirectoryOutput):
            role = f"output directory of sink {t.uid!r}"
            dirs += [
                OwnedDirectory(config.shard_path(Path(p)), role) for p in t.fn.output_directories()
            ]
    return dirs


def _outermost(directories: Iterable[OwnedDirectory]) -> list[OwnedDirectory]:
    """Each directory once, and none inside another: the outer lock covers it."""
    out: list[OwnedDirectory] = []
    for d in sorted(directories, key=lambda d: len(d.path.resolve().parts)):
        p = d.path.resolve()
        if not any(p.is_relative_to(o.path) for o in out):
            out.append(OwnedDirectory(p, d.role))
    return out


def _lock(d: OwnedDirectory, owner: bytes) -> tuple[int, Path, bool]:
    created = not d.path.is_dir()
    try:
        d.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(d.path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise DirectoryOwnedError(
            f"cannot lock the {d.role} {d.path}: {exc.strerror or exc}", retriable=True
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _describe_owner(fd)
        os.close(fd)
        raise DirectoryOwnedError(
            f"the {d.role} {d.path} is in use by {holder}; a directory has one owner at a "
            f"time: stop that job or give this one other directories (lock: {LOCK_FILE})"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner + b"\n", 0)
    except OSError as exc:  # a full disk: the lock holds all the same, only unnamed
        log.warning("%s: cannot write the owner line into %s: %s", d.path, LOCK_FILE, exc)
    return fd, d.path, created


def _describe_owner(fd: int) -> str:
    """Name the owner from its line; an owner that just locked gets a moment to write it."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            info = orjson.loads(os.pread(fd, 4096, 0))
            desc = f"pid {info['pid']} on host {info['host']} since {info['since']}"
            if info["pid"] == os.getpid() and info["host"] == socket.gethostname():
                desc += ", this process"
            return f"job {info['job']!r} ({desc})"
        except (orjson.JSONDecodeError, KeyError, TypeError, OSError):
            if time.monotonic() > deadline:
                return "another process (it wrote no owner line)"
            time.sleep(0.01)
