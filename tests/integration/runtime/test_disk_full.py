"""A full disk under the exactly-once file sink: a clear error, then nothing lost or duplicated.

The output directory is on a real, small tmpfs (no injected fault: the kernel
returns ENOSPC). The job must stop naming the file and the cause; once space
is freed, running the same command again resumes from the last completed
checkpoint and the committed output is exactly a failure-free run's.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiostream_ckpt.runtime.failover.ownership import LOCK_FILE
from tests.helpers import check_pv_output, cli, generated_counts, generated_pv_args

pytestmark = pytest.mark.integration

DISK_BYTES = 8 << 20


def _mount_tmpfs(mnt: Path, options: str) -> Iterator[Path]:
    """A tmpfs at ``mnt``, unmounted afterwards; skipped where mounting is not permitted."""
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs."""
    yield from _mount_tmpfs(tmp_path / "disk", f"size={DISK_BYTES}")


@pytest.fixture
def few_inodes(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs with room for 64 files or directories: creating one more fails with ENOSPC."""
    yield from _mount_tmpfs(tmp_path / "inodes", f"size={DISK_BYTES},nr_inodes=64")


def paced_args(ckpt: Path, out: Path, events: int, *extra: str) -> list[str]:
    """pv_count over ``events`` generated events, paced so that checkpoints (30 ms) commit."""
    return [
        *generated_pv_args(ckpt, out, events=events, splits=1, parallelism=1, keys=300),
        "--set", "app.rate=100000",
        "--set", "checkpoint.interval=30ms",
        "--set", "rest.enabled=false",
        *extra,
    ]  # fmt: skip


def assert_rerun_exact(
    args: list[str], out: Path, expected: Counter[str]
) -> subprocess.CompletedProcess[str]:
    """Run the same command again: it must finish with exactly a failure-free run's output."""
    done = cli(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    check = check_pv_output(out, expected)
    assert check.exact, (check.duplicates, check.missing, check.gaps[:3])
    assert check.records == expected.total()
    return done


def test_full_disk_stops_with_the_cause_and_a_rerun_completes_exactly_once(
    tmp_path: Path, small_disk: Path
) -> None:
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (DISK_BYTES - (1 << 20)))  # leaves ~1 MiB
    out = small_disk / "out"
    events = 150_000  # ~4.5 MB of output, paced over ~1.5 s so that checkpoints commit
    args = paced_args(
        tmp_path / "ckpt", out, events, "--set", "restart.attempts=1", "--set", "restart.delay=10ms"
    )
    expected = generated_counts(events, keys=300)
    full = cli(*args)
    assert full.returncode == 1, full.stderr[-3000:]
    last = full.stderr.strip().splitlines()[-1]
    assert "No space left on device" in last, last
    assert str(out) in last, last  # names the file
    assert "disk full" in last, last
    # retriable: the restart strategy gets its say before the job stops
    assert "restart 1 in" in full.stderr, full.stderr[-3000:]
    assert (
        "job 'pv_count' failed after 1 restart "
        "(restart.strategy=fixed_delay exhausted its restart.attempts=1): ConnectorError"
    ) in last, last
    partial = check_pv_output(out, expected)
    assert partial.records > 0  # checkpoints committed before the disk filled
    assert partial.duplicates == 0
    assert partial.missing > 0

    filler.unlink()
    done = assert_rerun_exact(args, out, expected)
    assert "restoring from checkpoint" in done.stderr


def test_full_checkpoint_storage_fails_the_job_naming_it_and_a_rerun_is_exact(
    tmp_path: Path, small_disk: Path
) -> None:
    """Snapshots that cannot be written are declined; past tolerable_failures the job fails."""
    ckpt = small_disk / "ckpt"
    out = tmp_path / "out"
    events = 100_000
    args = paced_args(
        ckpt,
        out,
        events,
        "--set", "checkpoint.tolerable_failures=3",
        "--set", "restart.attempts=0",
        # the working state, dead letters and address file on another disk: this
        # test fills the checkpoint storage only (on main they were in /tmp or had
        # the room the checkpoint directory's lock file now takes)
        "--set", f"state.local_dir={tmp_path / 'local'}",
        "--set", f"errors.dead_letter_dir={tmp_path / 'dead-letters'}",
        "--set", f"rest.address_file={tmp_path / 'daemon.json'}",
    )  # fmt: skip
    expected = generated_counts(events, keys=300)
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (DISK_BYTES - (8 << 10)))  # not one snapshot fits
    full = cli(*args)
    assert full.returncode == 1, full.stderr[-3000:]
    last = full.stderr.strip().splitlines()[-1]
    assert "4 consecutive checkpoint failures" in last, last
    assert "No space left on device" in last, last
    assert str(ckpt) in last, last
    assert "checkpoint storage is full" in last, last
    assert check_pv_output(out, expected).records == 0  # nothing was ever committed

    filler.unlink()
    assert_rerun_exact(args, out, expected)


def test_a_full_working_state_volume_stops_naming_it_and_a_rerun_is_exact(
    tmp_path: Path, small_disk: Path
) -> None:
    """The default ``state.local_dir`` is on the checkpoint volume; when that is full, say so.

    LMDB maps its lock file as a hole: on a full disk its first write used to
    kill the process with SIGBUS, no message, no restart.
    """
    ckpt = small_disk / "ckpt"
    out = tmp_path / "out"
    events = 100_000
    args = paced_args(
        ckpt, out, events, "--set", "restart.attempts=1", "--set", "restart.delay=10ms"
    )
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (DISK_BYTES - (8 << 10)))
    full = cli(*args)
    assert full.returncode == 1, full.stderr[-3000:]
    last = full.stderr.strip().splitlines()[-1]
    assert "job 'pv_count' failed after 1 restart" in last, last
    assert f"StateError: cannot create working state in {ckpt / 'local-state'}" in last, last
    assert "No space left on device" in last, last

    filler.unlink()
    assert_rerun_exact(args, out, generated_counts(events, keys=300))


def _use_up_inodes(mnt: Path) -> list[Path]:
    fillers = []
    while os.statvfs(mnt).f_ffree > 0:
        fillers.append(mnt / f"filler-{len(fillers)}")
        fillers[-1].touch()
    return fillers


def test_checkpoint_directories_that_cannot_be_created_decline_within_tolerable_failures(
    tmp_path: Path, few_inodes: Path
) -> None:
    """A full checkpoint volume fails the directory of a snapshot, not only its files.

    That happens in the synchronous part of the snapshot (on a full ext4 as on
    this tmpfs out of inodes); it must decline the checkpoint like a failed
    file write, count toward ``checkpoint.tolerable_failures``, and then go to
    the restart strategy (retriable), not fail the job at the first checkpoint.
    """
    ckpt = few_inodes / "ckpt"
    # what a former run left, so that the job can start: its directories, its lock file
    (ckpt / "shared").mkdir(parents=True)
    (ckpt / LOCK_FILE).touch()
    out = tmp_path / "out"
    events = 100_000
    args = paced_args(
        ckpt,
        out,
        events,
        "--set", "checkpoint.tolerable_failures=3",
        "--set", "restart.attempts=1",
        "--set", "restart.delay=10ms",
        "--set", f"state.local_dir={tmp_path / 'local'}",
        "--set", "errors.on_malformed=fail",
        "--set", f"rest.address_file={tmp_path / 'daemon.json'}",
    )  # fmt: skip
    expected = generated_counts(events, keys=300)
    fillers = _use_up_inodes(few_inodes)
    full = cli(*args)
    assert full.returncode == 1, full.stderr[-3000:]
    last = full.stderr.strip().splitlines()[-1]
    assert "checkpoint 1 declined" in full.stderr, full.stderr[-3000:]
    assert "restart 1 in" in full.stderr, full.stderr[-3000:]
    assert "job 'pv_count' failed after 1 restart" in last, last
    assert "4 consecutive checkpoint failures exceed tolerable_failures=3" in last, last
    assert "No space left on device" in last, last
    assert str(ckpt / "chk-") in last, last
    assert "checkpoint storage is full" in last, last
    assert check_pv_output(out, expected).records == 0  # nothing was ever committed

    for f in fillers:
        f.unlink()
    assert_rerun_exact(args, out, expected)
