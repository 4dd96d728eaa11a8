"""kill -9 during event-time windows with very late records: lateness survives a restore.

A restarted task used to start at the minimum watermark, so the very late
records of its first batches became window results (a window of one, long
closed) instead of going to the late output. With each task's watermark in
the checkpoint, both outputs equal a failure-free run's, however many kills.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.connectors.staging import read_committed_output
from aiostream_ckpt_dev.chaos.kills import read_fraction
from tests.apps import late_windows as app
from tests.helpers import REPO, cli_cmd, run_app_under_kills

pytestmark = pytest.mark.integration

#: Events a second each input is read at: a pass of 100 k lasts >= 2 s, 40 checkpoint
#: intervals, on any machine, for the 4 kills by input (9 blocks a file), and the rescale
#: test's first run is killed mid-input however fast the machine.
RATE = 50_000


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
    run_app_under_kills(
        tmp_path,
        "tests.apps.late_windows",
        [
            f"app.input={','.join(map(str, inputs))}",
            f"app.output={out}",
            f"app.late_output={late}",
            f"app.rate={RATE}",
        ],
        kills=4,
        seed=seed,
        inputs=inputs,
        parallelism=parallelism,
        batch_size=256,
    )
    _assert_exact(everything, out, late)


def _assert_exact(everything: list[dict[str, Any]], out: Path, late: Path) -> None:
    want_counts, want_late = app.expected(everything)
    got_counts = Counter((r["k"], r["start"], r["n"]) for r in read_committed_output(out))
    want = Counter((k, start, n) for (k, start), n in want_counts.items())
    assert got_counts == want, (
        sorted((got_counts - want).items())[:5],
        sorted((want - got_counts).items())[:5],
    )
    got_late = sorted(r["late"] for r in read_committed_output(late))
    assert got_late == sorted(want_late)


def test_lateness_exact_when_restored_at_another_parallelism(tmp_path: Path) -> None:
    """Killed at parallelism 2, resumed at 3: new subtasks take the old ones' minimum watermark.

    One input file (read by one source subtask whatever the parallelism), so the
    failure-free answer does not depend on the parallelism.
    """
    everything = app.generate(100_000, seed=20, late_every=64)
    inputs = [app.write(tmp_path / "in.jsonl", everything)]
    out, late, ckpt = tmp_path / "out", tmp_path / "late", tmp_path / "ckpt"

    def cmd(parallelism: int) -> list[str]:
        return cli_cmd(
            "run", "tests.apps.late_windows",
            "--set", f"checkpoint.dir={ckpt}",
            "--set", f"app.input={','.join(map(str, inputs))}",
            "--set", f"app.output={out}",
            "--set", f"app.late_output={late}",
            "--set", f"app.rate={RATE}",
            "--set", "checkpoint.interval=50ms",
            "--set", f"job.parallelism={parallelism}",
            "--set", "job.batch_size=256",
        )  # fmt: skip

    proc = subprocess.Popen(cmd(2), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    checkpoints: list[int] = []

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if m := re.search(rb"checkpoint (\d+) completed", line):
                checkpoints.append(int(m.group(1)))

    threading.Thread(target=pump, daemon=True).start()
    sizes = {str(p.resolve()): p.stat().st_size for p in inputs}
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if len(checkpoints) >= 2 and read_fraction(proc.pid, sizes) >= 0.4:
            proc.kill()  # SIGKILL
            break
        time.sleep(0.002)
    assert proc.wait(timeout=30) == -9, "the first run must be killed mid-input"
    resumed = subprocess.run(cmd(3), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "restoring from checkpoint" in resumed.stderr
    _assert_exact(everything, out, late)
