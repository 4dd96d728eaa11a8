"""Durability on a POSIX filesystem: what a rename or a create needs to survive a crash."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make renames and creations in ``directory`` durable (the entry, not just the data)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
