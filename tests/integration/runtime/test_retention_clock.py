"""Retention keeps shared state files by reference, whatever the process clock says.

The job's clock runs 30 s ahead of the filesystem's (file mtimes), three
checkpoints may be in flight at once and keyed state is incremental, so
in-flight snapshots reference shared files no retained checkpoint names yet.
Every completed checkpoint must stay restorable, and a real process started on
the same directory afterwards must resume it exactly.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from aiostream_ckpt.api.environment import StreamEnvironment
from aiostream_ckpt.checkpoint.storage import CheckpointStorage, read_checkpoint
from aiostream_ckpt.daemon.app_loader import build_app
from aiostream_ckpt.daemon.config import load_config
from aiostream_ckpt.runtime.job import JobRun, JobRunner
from tests.helpers import check_pv_output, cli, generated_counts, generated_pv_args

pytestmark = pytest.mark.integration

EVENTS, SPLITS, KEYS = 40_000, 2, 500


class ClockAhead:
    """The system clock, with wall time ``offset`` seconds ahead of the filesystem's."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def time(self) -> float:
        return time.time() + self.offset

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


def missing_files(ckpt: Path) -> dict[int, list[str]]:
    storage = CheckpointStorage(ckpt)
    out: dict[int, list[str]] = {}
    for cid in storage.completed_newest_first():
        chk = read_checkpoint(storage.checkpoint_dir(cid))
        gone = sorted(f for f in chk.referenced_files() if not (ckpt / f).exists())
        if gone:
            out[cid] = gone
    return out


def test_retention_with_clock_ahead_and_concurrent_checkpoints(tmp_path: Path) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    args = generated_pv_args(
        ckpt, out,
        "--set", "checkpoint.interval=2ms",
        "--set", "checkpoint.max_concurrent=3",
        "--set", "checkpoint.retained=1",
        "--set", "checkpoint.full_every=4",
        "--set", "checkpoint.max_delta_ratio=0",
        "--set", "job.batch_size=64",
        "--set", "app.rate=4000",
        events=EVENTS, splits=SPLITS, keys=KEYS, parallelism=2,
    )  # fmt: skip
    sets = [a for i, a in enumerate(args) if i > 0 and args[i - 1] == "--set"]
    loaded = load_config(None, env={}, sets=sets)
    env = StreamEnvironment("pv_count", config=loaded.job, params=loaded.params)
    build_app("apps.pv_count", env)

    async def run_then_cancel() -> None:
        started: asyncio.Future[JobRun] = asyncio.get_running_loop().create_future()
        runner = JobRunner(env.spec(), clock=ClockAhead(30.0), on_started=started.set_result)
        job = asyncio.create_task(runner.run())
        run = await started
        overlaps = 0
        while (run.last_checkpoint() or 0) < 40:
            assert not job.done(), "the job ended before 40 checkpoints"
            coord = run.coordinator
            if coord is not None and len(coord.pending_ids) > 1:
                overlaps += 1
            await asyncio.sleep(0.002)
        runner.cancel()  # checkpoints stay, as after SIGTERM: the next run resumes them
        await job
        assert overlaps, "no two checkpoints were ever in flight at once"

    asyncio.run(run_then_cancel())
    assert missing_files(ckpt) == {}, "retention deleted files a checkpoint references"

    resumed = cli(*args, "--set", "rest.enabled=false", "--set", "app.rate=10000000")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "restoring from checkpoint" in resumed.stderr
    check = check_pv_output(out, generated_counts(EVENTS, splits=SPLITS, keys=KEYS))
    assert check.exact, (check.duplicates, check.missing, check.gaps[:3])
