"""Working-state directories: a sweep removes the orphaned ones only."""

from __future__ import annotations

from pathlib import Path

from aiostream_ckpt.state import local_dirs


def test_a_live_jobs_directory_is_not_swept(tmp_path: Path) -> None:
    live = local_dirs.claim(tmp_path)
    unowned = tmp_path / "aiostream-state-old"  # an older version's: no owner file
    unowned.mkdir()
    dead = tmp_path / "aiostream-state-dead"
    dead.mkdir()
    (dead / local_dirs.OWNER).write_text("12345")  # nobody holds its lock
    mine = local_dirs.claim(tmp_path)
    assert live.path.exists() and unowned.exists() and not dead.exists()
    assert mine.path.exists()
    mine.release()
    live.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aiostream-state-old"]
