"""kill -9 during event-time windows with very late records: lateness survives a restore.

A restarted task used to start at the minimum watermark, so the very late
records of its first batches became window results (a window of one, long
closed) instead of going to the late output. With each task's watermark in
the checkpoint, both outputs equal a failure-free run's, however many kills.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from aiostream_ckpt.connectors.staging import read_committed_output
from aiostream_ckpt.testing.chaos import run_with_kills
from tests.apps import late_windows as app
from tests.helpers import REPO, cli_cmd

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("seed", range(2))
def test_late_output_and_windows_exact_under_kill9(tmp_path: Path, seed: int) -> None:
    parallelism = 1 + seed % 2
    inputs, everything = [], []
    for i in range(parallelism):
        # one late record per 64 events: every first batch after a restart holds some
        events = app.generate(100_000, seed=seed * 10 + i, late_every=64)
        events = [{**e, "k": f"{e['k']}-{i}"} for e in events]
        inputs.append(app.write(tmp_path / f"in-{i}.jsonl", events))
        everything.extend(events)
    out, late = tmp_path / "out", tmp_path / "late"
    cmd = cli_cmd(
        "run",
        "tests.apps.late_windows",
        "--set",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "--set",
        f"app.input={','.join(map(str, inputs))}",
        "--set",
        f"app.output={out}",
        "--set",
        f"app.late_output={late}",
        "--set",
        "checkpoint.interval=50ms",
        "--set",
        f"job.parallelism={parallelism}",
        "--set",
        "job.batch_size=256",
    )
    log = tmp_path / "worker.log"
    result = run_with_kills(
        cmd, kills=4, seed=seed, timeout=300, log_path=log, cwd=REPO, inputs=inputs
    )
    assert result.exit_code == 0, log.read_text()[-4000:]
    assert result.kills == 4, log.read_text()[-3000:]
    want_counts, want_late = app.expected(everything)
    got_counts = Counter((r["k"], r["start"], r["n"]) for r in read_committed_output(out))
    want = Counter((k, start, n) for (k, start), n in want_counts.items())
    assert got_counts == want, (
        sorted((got_counts - want).items())[:5],
        sorted((want - got_counts).items())[:5],
    )
    got_late = sorted(r["late"] for r in read_committed_output(late))
    assert got_late == sorted(want_late)
