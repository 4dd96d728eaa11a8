"""Disposing of a savepoint: find it, refuse one the job depends on, remove it and its copies.

A savepoint is self-contained: its state files and its copies of the output
it lists as pre-committed (:mod:`aiostream_ckpt.connectors.held_output`)
are all in its directory, so disposing of it (Flink's ``savepoint -d``)
releases everything it holds by removing that directory. It is refused for
a savepoint the running job would restore after a failure (the
``--from-savepoint`` one until a checkpoint completed, the directory's
stop-with-savepoint savepoint while no checkpoint is newer) and for one
still being taken; and for a directory that is not a savepoint, so no REST
call removes anything else.

The ``_metadata`` goes first, durably: a crash half way leaves a directory
that is no longer a restorable savepoint, never one that looks whole.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from aiostream_ckpt.checkpoint.metadata import METADATA_FILE
from aiostream_ckpt.checkpoint.storage import read_checkpoint
from aiostream_ckpt.durable import fsync_dir
from aiostream_ckpt.errors import AiostreamError, CorruptCheckpointError

log = logging.getLogger(__name__)


class SavepointDisposalError(AiostreamError):
    """The savepoint cannot be disposed of: not found, not a savepoint, or still needed."""

    def __init__(self, message: str, *, not_found: bool = False, in_use: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found
        self.in_use = in_use


def find_savepoint(
    target: str, known: Mapping[int, Path], search: Iterable[Path]
) -> tuple[int, Path]:
    """Resolve ``target`` (a path, or a savepoint id) to ``(id, directory)`` of a savepoint.

    An id is looked up among ``known`` (the daemon's own savepoints), then
    among the savepoint directories in ``search``; it must name one.
    """
    if target.isdigit():
        wanted = int(target)
        if wanted in known:
            return wanted, known[wanted]
        found = sorted(
            {p.resolve() for d in search for p in _savepoints_in(d) if _id_of(p) == wanted}
        )
        if not found:
            where = ", ".join(str(d) for d in search) or "nowhere"
            raise SavepointDisposalError(
                f"no savepoint {wanted} is known to this daemon or found in {where}; give its path",
                not_found=True,
            )
        if len(found) > 1:
            raise SavepointDisposalError(
                f"savepoint id {wanted} names {len(found)} savepoints "
                f"({', '.join(map(str, found))}); give the path of the one to dispose of"
            )
        return wanted, found[0]
    path = Path(target).expanduser().resolve()
    if not path.is_dir():
        raise SavepointDisposalError(f"{path}: no such savepoint directory", not_found=True)
    try:
        chk = read_checkpoint(path)
    except CorruptCheckpointError as exc:
        raise SavepointDisposalError(
            f"{path} is not a readable savepoint ({exc}); nothing was removed"
        ) from exc
    if not chk.is_savepoint:
        raise SavepointDisposalError(
            f"{path} is a checkpoint, not a savepoint: retention removes checkpoints; "
            "nothing was removed"
        )
    return chk.checkpoint_id, path


def _savepoints_in(directory: Path) -> list[Path]:
    try:
        return [p for p in directory.iterdir() if (p / METADATA_FILE).is_file()]
    except OSError:
        return []


def _id_of(path: Path) -> int | None:
    try:
        chk = read_checkpoint(path)
    except CorruptCheckpointError:
        return None
    return chk.checkpoint_id if chk.is_savepoint else None


def dispose_directory(path: Path) -> int:
    """Remove the savepoint at ``path``, ``_metadata`` first; return the bytes freed."""
    size = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except OSError:
                continue
            if st.st_nlink == 1:  # a copy also linked as committed output frees nothing
                size += st.st_size
    try:
        (path / METADATA_FILE).unlink()
        fsync_dir(path)
        shutil.rmtree(path)
        fsync_dir(path.parent)
    except OSError as exc:
        raise SavepointDisposalError(
            f"cannot remove savepoint {path}: {exc.strerror or exc}"
            + (
                "; its _metadata is gone, so it is no longer restorable"
                if not (path / METADATA_FILE).exists()
                else ""
            )
        ) from exc
    return size
