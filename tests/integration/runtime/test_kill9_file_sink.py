"""kill -9 at random moments during pv_count with the file sink.

Exactly-once: the committed output equals the failure-free result exactly.
At-least-once: nothing is lost; duplicates are allowed and counted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aiostream_ckpt_dev.chaos.kills import run_with_kills
from tests.helpers import REPO, check_pv_output, cli_cmd, make_pv_input, recount

pytestmark = pytest.mark.integration


def _run(
    tmp_path: Path,
    *extra: str,
    seed: int,
    mode: str,
    parallelism: int,
    kills: int,
    by_input: bool,
):
    # by time: enough input that the job outlives 3 kills (each <= 0.12 s after a
    # checkpoint); by input: kills at random points of it, all happen however fast
    inputs = [
        make_pv_input(tmp_path / f"in-{i}.jsonl", 800_000, seed=seed * 10 + i, malformed=2)
        for i in range(parallelism)
    ]
    out = tmp_path / "out"
    cmd = cli_cmd(
        "run",
        "apps.pv_count",
        "--set",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "--set",
        f"app.input={','.join(map(str, inputs))}",
        "--set",
        f"app.output={out}",
        "--set",
        "checkpoint.interval=50ms",
        "--set",
        f"checkpoint.mode={mode}",
        "--set",
        f"job.parallelism={parallelism}",
        "--set",
        "job.batch_size=512",
        *extra,
    )
    log = tmp_path / "worker.log"
    result = run_with_kills(
        cmd,
        kills=kills,
        seed=seed,
        max_delay_after_checkpoint=0.12,
        timeout=240,
        log_path=log,
        cwd=REPO,
        inputs=inputs if by_input else None,
    )
    assert result.exit_code == 0, log.read_text()[-4000:]
    return result, check_pv_output(out, recount(*inputs)), log


@pytest.mark.parametrize("seed", range(6))
def test_exactly_once_under_kill9(tmp_path: Path, seed: int) -> None:
    parallelism = 1 + seed % 2
    result, check, log = _run(
        tmp_path,
        seed=seed,
        mode="exactly_once",
        parallelism=parallelism,
        kills=3,
        by_input=True,
    )
    assert result.kills == 3, log.read_text()[-3000:]
    assert check.exact, (check.duplicates, check.missing, check.gaps[:5])


@pytest.mark.parametrize("seed", range(3))
def test_rolling_part_files_exactly_once_under_kill9(tmp_path: Path, seed: int) -> None:
    """Part files span checkpoints (rolled at 4 MiB, ~4 checkpoints): kills hit open ones."""
    from aiostream_ckpt.connectors.staging import committed_files

    result, check, log = _run(
        tmp_path,
        "--set",
        "app.roll_size=4194304",
        seed=200 + seed,
        mode="exactly_once",
        parallelism=1 + seed % 2,
        kills=3,
        by_input=True,
    )
    assert result.kills == 3, log.read_text()[-3000:]
    assert check.exact, (check.duplicates, check.missing, check.gaps[:5])
    text = log.read_text()
    checkpoints = text.count(" completed in ")
    files = committed_files(tmp_path / "out")
    assert "bytes of open part file" in text, "a kill hit an open part file and it was resumed"
    assert len(files) < checkpoints / 2, (len(files), checkpoints)


@pytest.mark.parametrize("seed", range(3))
def test_at_least_once_under_kill9_loses_nothing(tmp_path: Path, seed: int) -> None:
    result, check, log = _run(
        tmp_path, seed=100 + seed, mode="at_least_once", parallelism=2, kills=3, by_input=False
    )
    assert result.kills >= 2, log.read_text()[-3000:]
    assert check.missing == 0, check.gaps[:5]
    print(f"at-least-once duplicates counted: {check.duplicates}")
