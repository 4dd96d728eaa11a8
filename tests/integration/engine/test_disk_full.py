"""A full disk under the exactly-once file sink: a clear error, then nothing lost or duplicated.

The output directory is on a real, small tmpfs (no injected fault: the kernel
returns ENOSPC). The job must stop naming the file and the cause; once space
is freed, running the same command again resumes from the last completed
checkpoint and the committed output is exactly a failure-free run's.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import check_pv_output, cli, generated_counts, generated_pv_args

pytestmark = pytest.mark.integration

DISK_BYTES = 8 << 20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs, unmounted afterwards; skipped where mounting is not permitted."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_stops_with_the_cause_and_a_rerun_completes_exactly_once(
    tmp_path: Path, small_disk: Path
) -> None:
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (DISK_BYTES - (1 << 20)))  # leaves ~1 MiB
    out = small_disk / "out"
    events = 150_000  # ~4.5 MB of output, paced over ~1.5 s so that checkpoints commit
    args = [
        *generated_pv_args(
            tmp_path / "ckpt", out, events=events, splits=1, parallelism=1, keys=300
        ),
        "--set", "app.rate=100000",
        "--set", "checkpoint.interval=30ms",
        "--set", "restart.attempts=1",
        "--set", "restart.delay=10ms",
        "--set", "rest.enabled=false",
    ]  # fmt: skip
    expected = generated_counts(events, keys=300)
    full = cli(*args)
    assert full.returncode == 1, full.stderr[-3000:]
    last = full.stderr.strip().splitlines()[-1]
    assert "No space left on device" in last, last
    assert str(out) in last, last  # names the file
    assert "disk full" in last, last
    partial = check_pv_output(out, expected)
    assert partial.records > 0  # checkpoints committed before the disk filled
    assert partial.duplicates == 0
    assert partial.missing > 0

    filler.unlink()
    done = cli(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "restoring from checkpoint" in done.stderr
    check = check_pv_output(out, expected)
    assert check.exact, (check.duplicates, check.missing, check.gaps[:3])
    assert check.records == events


def test_full_checkpoint_storage_fails_the_job_naming_it_and_a_rerun_is_exact(
    tmp_path: Path, small_disk: Path
) -> None:
    """Snapshots that cannot be written are declined; past tolerable_failures the job fails."""
    ckpt = small_disk / "ckpt"
    out = tmp_path / "out"
    events = 100_000
    args = [
        *generated_pv_args(ckpt, out, events=events, splits=1, parallelism=1, keys=300),
        "--set", "app.rate=100000",
        "--set", "checkpoint.interval=30ms",
        "--set", "checkpoint.tolerable_failures=3",
        "--set", "restart.attempts=0",
        "--set", "rest.enabled=false",
    ]  # fmt: skip
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
    done = cli(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    check = check_pv_output(out, expected)
    assert check.exact, (check.duplicates, check.missing, check.gaps[:3])
    assert check.records == events
