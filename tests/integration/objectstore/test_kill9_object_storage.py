"""kill -9 with checkpoints in SeaweedFS, each restart on an empty local disk.

Every run of ``aiostream-ckpt run`` gets a new ``checkpoint.local_dir`` (the
previous one deleted): it restores by downloading its chain from the store.
The committed output must equal a failure-free run's: per key the counts
1..n, each once. One test restarts the S3 server while the job runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from aiostream_ckpt.connectors.object_sink import read_object_output
from aiostream_ckpt_dev.chaos.kills import run_with_kills
from aiostream_ckpt_dev.recount import check_pv_updates, recount_inputs
from aiostream_ckpt_dev.s3server import SeaweedS3
from tests.helpers import REPO, check_pv_output, cli_cmd, make_pv_input, recount

pytestmark = pytest.mark.integration

EVENTS, RATE = 60_000, 30_000


class Job:
    """pv_count over paced files, checkpoints in ``prefix``, a fresh local disk per run."""

    def __init__(
        self,
        tmp_path: Path,
        prefix: str,
        *,
        seed: int,
        parallelism: int,
        output: str | None = None,
        **extra: str,
    ) -> None:
        self.tmp = tmp_path
        self.prefix = prefix
        self.parallelism = parallelism
        self.inputs = [
            make_pv_input(tmp_path / f"in-{i}.jsonl", EVENTS, seed=seed * 10 + i, malformed=1)
            for i in range(parallelism)
        ]
        #: a local directory, or ``s3://...``: then nothing of the job stays on the disk
        self.out: Path | str = output or tmp_path / "out"
        self.log = tmp_path / "worker.log"
        self.extra = extra

    def cmd(self, run: int) -> list[str]:
        shutil.rmtree(self.tmp / f"local-{run - 1}", ignore_errors=True)  # an empty disk
        sets = {
            "checkpoint.dir": self.prefix,
            "checkpoint.local_dir": str(self.tmp / f"local-{run}"),
            "checkpoint.interval": "150ms",
            "job.parallelism": str(self.parallelism),
            "job.batch_size": "512",
            "rest.enabled": "false",
            "app.input": ",".join(map(str, self.inputs)),
            "app.output": str(self.out),
            "app.rate": str(RATE),
            **self.extra,
        }
        return cli_cmd(
            "run", "apps.pv_count", *(a for k, v in sets.items() for a in ("--set", f"{k}={v}"))
        )

    def run(
        self, *, seed: int, kills: int, first: int = 1, on_line: Callable[[str], None] | None = None
    ) -> int:
        result = run_with_kills(
            lambda run: self.cmd(run + first - 1),
            kills=kills,
            seed=seed,
            max_delay_after_checkpoint=0.2,
            timeout=240,
            log_path=self.log,
            cwd=REPO,
            inputs=self.inputs,
            on_line=on_line,
        )
        text = self.log.read_text()
        assert result.exit_code == 0, text[-4000:]
        assert result.kills == kills, text[-3000:]
        return result.runs

    def assert_exact(self) -> None:
        if isinstance(self.out, str):
            expected, malformed = recount_inputs(self.inputs)
            updates = read_object_output(self.out)
            verdict = check_pv_updates(updates, expected, malformed=malformed)
            assert verdict.passed, verdict.problems[:10]
            return
        check = check_pv_output(self.out, recount(*self.inputs))
        assert check.exact, (check.duplicates, check.missing, check.gaps[:5])


@pytest.mark.parametrize("seed", range(2))
def test_kill9_restores_from_the_store_on_an_empty_disk(
    tmp_path: Path, s3_prefix: str, seed: int
) -> None:
    job = Job(tmp_path, s3_prefix, seed=seed, parallelism=1 + seed % 2)
    assert job.run(seed=seed, kills=3) == 4
    job.assert_exact()
    assert "state file(s) from s3://" in job.log.read_text(), "a restart downloaded its chain"


@pytest.mark.parametrize("seed", range(2))
def test_kill9_with_output_in_the_store(tmp_path: Path, s3_prefix: str, seed: int) -> None:
    """Checkpoints and committed output both in the store: each host's disk is disposable."""
    out = f"{s3_prefix}/out"
    job = Job(tmp_path, f"{s3_prefix}/ckpt", seed=20 + seed, parallelism=1 + seed % 2, output=out)
    job.run(seed=20 + seed, kills=3)
    job.assert_exact()
    assert not (tmp_path / "out").exists()


def test_kill9_unaligned_checkpoints_carry_their_channel_state(
    tmp_path: Path, s3_prefix: str
) -> None:
    """Unaligned: in-flight records go into chk-N/<uid>-<subtask>/channel-state, uploaded too."""
    job = Job(tmp_path, s3_prefix, seed=31, parallelism=2, **{"checkpoint.unaligned": "true"})
    job.run(seed=31, kills=3)
    job.assert_exact()


def test_kill9_between_the_uploads_and_the_chain_write(tmp_path: Path, s3_prefix: str) -> None:
    """Killed with a checkpoint's files and metadata uploaded, its chain write not made.

    The restart (empty disk) restores the checkpoint before; the orphaned
    objects are swept when it claims the prefix.
    """
    job = Job(tmp_path, s3_prefix, seed=11, parallelism=2)
    env = {**os.environ, "AIOSTREAM_FAILPOINTS": "checkpoint_uploaded=kill@4"}
    with open(job.log, "ab") as log:
        first = subprocess.run(job.cmd(1), env=env, cwd=REPO, stderr=log, timeout=240, check=False)
    assert first.returncode == -9, job.log.read_text()[-3000:]
    job.run(seed=11, kills=0, first=2)
    job.assert_exact()
    assert "no checkpoint references" in job.log.read_text()


def test_s3_server_restarted_mid_run(tmp_path: Path, s3_server: SeaweedS3, s3_prefix: str) -> None:
    """The server goes away for seconds mid-run; client retries and failover ride it out."""
    completed = 0
    restarter = threading.Thread(target=s3_server.restart, kwargs={"graceful": False})

    def on_line(line: str) -> None:
        nonlocal completed
        if " completed in " in line:
            completed += 1
            if completed == 5:
                restarter.start()

    job = Job(tmp_path, s3_prefix, seed=7, parallelism=2)
    job.run(seed=7, kills=1, on_line=on_line)
    restarter.join(60)
    assert completed >= 5
    job.assert_exact()
