"""The working LMDB environment of one backend: its directory's name and how it is opened."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import lmdb

from aiostream_ckpt.state.local_dirs import working_state_error

MAP_SIZE = 64 << 30  # sparse; only touched pages take disk
#: LMDB's reader table for max_readers=512 (a 128-byte header, 64 bytes a reader), with room
_LOCK_FILE_BYTES = 64 << 10


def safe_name(text: str) -> str:
    """Return ``text`` usable in a file name, made unique by a hash if it had to change."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:80]
    if safe != text:
        safe += "-" + uuid.uuid5(uuid.NAMESPACE_OID, text).hex[:8]
    return safe


def reserve_lock_file(directory: Path) -> None:
    """Allocate LMDB's ``lock.mdb`` before LMDB maps it.

    LMDB sizes the lock file with ``ftruncate`` (a hole) and writes it through a
    shared mapping: on a full filesystem the first write into the hole is a
    SIGBUS and the process dies without a word. With its blocks allocated
    there is nothing left to fail, and a full disk is an error here instead,
    naming the directory (retriable: space may be freed before the restart).
    """
    fd = -1
    try:
        fd = os.open(directory / "lock.mdb", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        os.posix_fallocate(fd, 0, _LOCK_FILE_BYTES)
    except OSError as exc:
        raise working_state_error(directory, exc) from exc
    finally:
        if fd >= 0:
            os.close(fd)


def open_env(directory: Path) -> lmdb.Environment:
    """Open (or create) the working LMDB in ``directory``: no syncs, it is rebuilt on restore."""
    reserve_lock_file(directory)
    return lmdb.open(
        str(directory),
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
