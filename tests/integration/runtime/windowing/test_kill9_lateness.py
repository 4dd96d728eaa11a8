"""kill -9 during event-time windows with very late records: lateness survives a restore.

A restarted task used to start at the minimum watermark, so the very late
records of its first batches became window results (a window of one, long
closed) instead of going to the late output. With each task's watermark in
the checkpoint, both outputs equal a failure-free run's, however many kills,
also with the subtasks in worker processes (``job.workers=2``).
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


#: How far input 1's event time is behind input 0's in the lagging case: source subtask 1
#: holds every window subtask's watermark that far behind subtask 0's
LAG_MS = 100_000
#: How far behind the newest event a late record of the idle case is: late against a
#: watermark that advances (a window and the bounded delay are 11 s), not against one
#: stuck where a restart found it, for the rest of the input (>= 40 s of event time)
IDLE_LATE_BY_MS = 60_000


def _inputs(tmp: Path, case: str) -> tuple[list[Path], list[dict[str, Any]]]:
    """``lagging``: 2 inputs, input 1 LAG_MS behind; ``idle``: 1 input, late by 60 s."""
    inputs, everything = [], []
    for i in range(2 if case == "lagging" else 1):
        events = app.generate(40_000, seed=40 + i, late_every=64)
        if case == "idle":  # late by 60 s, from the 10,000th event (after start-up)
            events = [
                {**e, "ts": e["ts"] + app.LATE_BY_MS - IDLE_LATE_BY_MS} if "late" in e else e
                for e in events
                if e.get("late", 10_000) >= 10_000
            ]
        events = [{**e, "k": f"{e['k']}-{i}", "ts": e["ts"] - LAG_MS * i} for e in events]
        inputs.append(app.write(tmp / f"in-{i}.jsonl", events))
        everything.extend(events)
    return inputs, everything


@pytest.mark.parametrize("case", ["lagging", "idle"])
def test_lateness_per_subtask_exact_in_worker_processes_under_kill9(
    tmp_path: Path, case: str
) -> None:
    """job.workers=2, parallelism 2: each subtask's restored event time is its own.

    ``lagging``: source subtask 1 reads an input 100 s of event time behind
    subtask 0's. Had a worker restored subtask 0's event time into subtask 1,
    its records would be late after a restart (as they are with the subtasks'
    restored time swapped; with none restored, very late records become
    window results). ``idle``: one input file, so source subtask 1 has no
    split and is idle the whole run. Had it come back not idle, with the
    windows' channel from it not idle either, it would hold their watermark
    where the restart found it, and records 60 s late would become window
    results. Kills hit the main process or a worker; late output and windows
    equal a failure-free run's.
    """
    inputs, everything = _inputs(tmp_path, case)
    out, late = tmp_path / "out", tmp_path / "late"
    result, log = run_app_under_kills(
        tmp_path,
        "tests.apps.late_windows",
        [
            f"app.input={','.join(map(str, inputs))}",
            f"app.output={out}",
            f"app.late_output={late}",
            "app.rate=20000",  # a pass >= 2 s, 40 checkpoint intervals
            "job.workers=2",
            "restart.delay=0s",
        ],
        kills=3,
        seed=5,
        inputs=inputs,
        parallelism=2,
        batch_size=256,
        kill_workers=True,
    )
    assert result.worker_kills >= 1, log.read_text()[-3000:]  # a worker, not only the main
    _assert_exact(everything, out, late)
