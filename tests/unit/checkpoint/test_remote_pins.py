"""Retention keeps the shared files worker processes pin, asked after listing the files.

With ``job.workers`` > 1 the state backends (and their pins) live in the
workers while retention runs in the main process: a delta file a worker is
writing for a pending checkpoint is referenced by no metadata yet, so only
its pin keeps it.
"""

from __future__ import annotations

from pathlib import Path

from aiostream_ckpt.checkpoint.storage import CheckpointStorage


def test_retention_keeps_what_the_workers_pin(tmp_path: Path) -> None:
    storage = CheckpointStorage(tmp_path)
    pinned = storage.shared_dir / "pv-count-1-7-ab-delta.bin"
    loose = storage.shared_dir / "pv-count-0-3-cd-delta.bin"
    pinned.write_bytes(b"x")
    loose.write_bytes(b"y")
    storage.remote_pins = lambda: {"shared/pv-count-1-7-ab-delta.bin"}
    storage.apply_retention(1)
    assert pinned.exists() and not loose.exists()


def test_a_file_created_after_the_listing_is_never_deleted(tmp_path: Path) -> None:
    """A worker pins a file before creating it: asked after the listing, retention is safe."""
    storage = CheckpointStorage(tmp_path)
    late = storage.shared_dir / "pv-count-1-8-ab-delta.bin"
    asked: list[bool] = []

    def pins() -> set[str]:
        asked.append(late.exists())
        late.write_bytes(b"z")  # written meanwhile (its pin was taken before, in the worker)
        return set()

    storage.remote_pins = pins
    storage.apply_retention(1)
    assert asked == [False] and late.exists()
