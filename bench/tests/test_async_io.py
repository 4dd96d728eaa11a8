"""``bench.async_io``: the blocking rows report a rate and checkpoints at the interval."""

from __future__ import annotations

import pytest

from bench.async_io import parse_args, run_rows

pytestmark = pytest.mark.integration


def test_the_blocking_row_gets_a_rate_and_commits_at_the_checkpoint_interval(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 2 ms lookups, 0.25 s checkpoints: 1,000 records take 2 s, ~8 checkpoints. With
    # the job's 2048-record batches the blocking map held the barrier through all of
    # them (one commit at the end, no rate: the bug the lead saw at 1,500 x 10 ms).
    args = [
        "--latency", "0.002", "--interval", "0.25", "--sync-events", "1000",
        "--base-events", "200", "--repeats", "1", "--only", "sync-simulated",
    ]  # fmt: skip
    [row] = run_rows(parse_args(args))
    assert row["rate_method"] == "steps" and 200 < row["rate_median"] < 500, row
    assert row["commit_gap_s"] is not None and row["commit_gap_s"] < 0.6, row
    assert row["exactly_once"]
    assert "sync-simulated" in capsys.readouterr().out
