"""kill -9 during windowed processing: transitions_per_hour through the CLI.

The committed output must be exactly the failure-free answer: every (user,
hour) once, with the right count. That needs the buffered events, the last
event per user, the timers and the window counts all restored from the
checkpoint, and the source replayed from its offsets.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from aiostream_ckpt.connectors.staging import read_committed_output
from aiostream_ckpt_dev.chaos.kills import run_with_kills
from apps import transitions_per_hour as app
from tests.helpers import REPO, cli_cmd

pytestmark = pytest.mark.integration

MAX_DELAY = 300_000


@pytest.mark.parametrize("seed", range(3))
def test_transitions_exact_under_kill9(tmp_path: Path, seed: int) -> None:
    parallelism = 1 + seed % 2
    inputs, everything = [], []
    for i in range(parallelism):
        # users are split between files: each user's events come from one input
        events = app.generate_events(
            60_000, users=40, max_delay=MAX_DELAY, seed=seed * 10 + i, step_ms=2_000
        )
        events = [{**e, "user_id": f"{e['user_id']}-{i}"} for e in events]
        inputs.append(app.write_events(tmp_path / f"in-{i}.jsonl", events))
        everything.extend(events)
    out = tmp_path / "out"
    cmd = cli_cmd(
        "run",
        "apps.transitions_per_hour",
        "--set",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "--set",
        f"app.input={','.join(map(str, inputs))}",
        "--set",
        f"app.output={out}",
        "--set",
        f"app.max_delay={MAX_DELAY}",
        "--set",
        "checkpoint.interval=50ms",
        "--set",
        f"job.parallelism={parallelism}",
        "--set",
        "job.batch_size=256",
    )
    log = tmp_path / "worker.log"
    result = run_with_kills(
        cmd,
        kills=3,
        seed=seed,
        max_delay_after_checkpoint=0.15,
        timeout=300,
        log_path=log,
        cwd=REPO,
    )
    assert result.exit_code == 0, log.read_text()[-4000:]
    assert result.kills >= 2, log.read_text()[-3000:]
    got = Counter(
        (r["user_id"], r["hour_start"], r["transitions"]) for r in read_committed_output(out)
    )
    want = Counter((u, h, n) for (u, h), n in app.expected_transitions(everything).items())
    assert got == want, (sorted((got - want).items())[:5], sorted((want - got).items())[:5])
