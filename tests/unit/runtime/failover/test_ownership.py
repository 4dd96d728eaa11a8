"""Directory locks within one process: re-entrant for one job, refused for another."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aiostream_ckpt.errors import DirectoryOwnedError
from aiostream_ckpt.runtime.failover.ownership import LOCK_FILE, DirectoryLocks, OwnedDirectory


def locks(job: str, *dirs: Path) -> DirectoryLocks:
    return DirectoryLocks(job, [OwnedDirectory(d, f"dir {d.name}") for d in dirs])


def test_the_same_job_may_hold_its_locks_twice_another_job_in_the_process_may_not(
    tmp_path: Path,
) -> None:
    mine = locks("a", tmp_path / "ckpt")
    with mine:
        with mine:  # the daemon holds them and the runner inside takes them again
            pass
        assert mine.held
        with pytest.raises(DirectoryOwnedError) as err:
            locks("b", tmp_path / "ckpt").acquire()
        assert f"dir ckpt {tmp_path / 'ckpt'} is in use by job 'a' (pid {os.getpid()}" in str(
            err.value
        )
        assert "this process" in str(err.value)
    assert not mine.held
    with locks("b", tmp_path / "ckpt"):  # released: the next owner gets it
        pass


def test_a_refused_start_keeps_no_lock(tmp_path: Path) -> None:
    with locks("a", tmp_path / "out"), pytest.raises(DirectoryOwnedError, match="dir out"):
        locks("b", tmp_path / "ckpt", tmp_path / "out").acquire()
    with locks("c", tmp_path / "ckpt"):  # "b" did not keep the checkpoint directory
        pass


def test_a_directory_inside_an_owned_one_is_covered_by_its_lock(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    job = locks("a", ckpt / "local-state" / "a", ckpt, ckpt / "dead-letter" / "events", ckpt)
    assert [d.path for d in job.directories] == [ckpt.resolve()]
    with job:
        assert (ckpt / LOCK_FILE).exists()
        assert not (ckpt / "local-state" / "a").exists()


def test_owner_line_is_cleared_on_release(tmp_path: Path) -> None:
    with locks("a", tmp_path):
        assert f'"pid":{os.getpid()}' in (tmp_path / LOCK_FILE).read_text()
    assert (tmp_path / LOCK_FILE).read_text() == ""


def test_a_refused_start_leaves_no_directory_it_created(tmp_path: Path) -> None:
    existing = tmp_path / "ckpt"
    existing.mkdir()
    job = locks("a", existing, tmp_path / "out", tmp_path / "busy")
    (tmp_path / "busy").mkdir()
    with locks("owner", tmp_path / "busy"), pytest.raises(DirectoryOwnedError):
        job.acquire()
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in existing.iterdir()) == [LOCK_FILE]  # it existed before

    with job:  # refused later (its checkpoints belong to another job): the same
        (existing / "shared").mkdir()
        job.leave_no_trace()
    assert not (tmp_path / "out").exists()
    assert (existing / "shared").exists()
