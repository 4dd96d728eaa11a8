"""kill -9 at random moments during pv_count with the file sink.

Exactly-once: the committed output equals the failure-free result exactly.
At-least-once: nothing is lost; duplicates are allowed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import check_pv_output, make_pv_input, recount, run_app_under_kills

pytestmark = pytest.mark.integration

#: Events per input file, read at most RATE a second.
EVENTS, RATE = 100_000, 60_000


def _run(
    tmp_path: Path,
    *settings: str,
    seed: int,
    mode: str,
    parallelism: int,
    kills: int,
    at_least: int | None = None,
    by_input: bool,
    rate: int = RATE,
):
    # paced: a pass lasts >= 1.7 s, 34 checkpoint intervals, on any machine, so it
    # outlives 3 kills by time (each <= 0.12 s after a checkpoint) and has checkpoints
    # before each kill by input (27 blocks a file). Before, 800 k events a file stood
    # in for the pace: ~100 s a test at load 20.
    inputs = [
        make_pv_input(tmp_path / f"in-{i}.jsonl", EVENTS, seed=seed * 10 + i, malformed=2)
        for i in range(parallelism)
    ]
    out = tmp_path / "out"
    result, log = run_app_under_kills(
        tmp_path,
        "apps.pv_count",
        [
            f"app.input={','.join(map(str, inputs))}",
            f"app.output={out}",
            f"checkpoint.mode={mode}",
            f"app.rate={rate}",
            *settings,
        ],
        kills=kills,
        at_least=at_least,
        seed=seed,
        inputs=inputs if by_input else None,
        parallelism=parallelism,
        max_delay_after_checkpoint=0.12,
        timeout=240,
    )
    return result, check_pv_output(out, recount(*inputs)), log


@pytest.mark.parametrize("seed", range(6))
def test_exactly_once_under_kill9(tmp_path: Path, seed: int) -> None:
    parallelism = 1 + seed % 2
    _, check, _ = _run(
        tmp_path,
        seed=seed,
        mode="exactly_once",
        parallelism=parallelism,
        kills=3,
        by_input=True,
    )
    assert check.exact, (check.duplicates, check.missing, check.gaps[:5])


@pytest.mark.parametrize("seed", range(3))
def test_rolling_part_files_exactly_once_under_kill9(tmp_path: Path, seed: int) -> None:
    """Part files span checkpoints (rolled at 512 KiB, ~6 a subtask): kills hit open ones.

    Each kill starts new part files (a restore commits the open ones), so files <
    checkpoints / 2 takes many checkpoints per kill: at 10 k events/s a pass lasts
    10 s, ~25 checkpoints even where each takes 0.4 s (load 20), ~160 on an idle machine.
    """
    from aiostream_ckpt.connectors.staging import committed_files

    _, check, log = _run(
        tmp_path,
        "app.roll_size=524288",
        rate=10_000,
        seed=200 + seed,
        mode="exactly_once",
        parallelism=1 + seed % 2,
        kills=3,
        by_input=True,
    )
    assert check.exact, (check.duplicates, check.missing, check.gaps[:5])
    text = log.read_text()
    checkpoints = text.count(" completed in ")
    files = committed_files(tmp_path / "out")
    assert "bytes of open part file" in text, "a kill hit an open part file and it was resumed"
    assert len(files) < checkpoints / 2, (len(files), checkpoints)


@pytest.mark.parametrize("seed", range(3))
def test_at_least_once_under_kill9_loses_nothing(tmp_path: Path, seed: int) -> None:
    _, check, _ = _run(
        tmp_path,
        seed=100 + seed,
        mode="at_least_once",
        parallelism=2,
        kills=3,
        at_least=2,
        by_input=False,
    )
    assert check.missing == 0, check.gaps[:5]
