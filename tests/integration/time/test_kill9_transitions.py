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
from apps import transitions_per_hour as app
from tests.helpers import run_app_under_kills

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
    run_app_under_kills(
        tmp_path,
        "apps.transitions_per_hour",
        [
            f"app.input={','.join(map(str, inputs))}",
            f"app.output={out}",
            f"app.max_delay={MAX_DELAY}",
        ],
        kills=3,
        at_least=2,
        seed=seed,
        parallelism=parallelism,
        batch_size=256,
        max_delay_after_checkpoint=0.15,
    )
    got = Counter(
        (r["user_id"], r["hour_start"], r["transitions"]) for r in read_committed_output(out)
    )
    want = Counter((u, h, n) for (u, h), n in app.expected_transitions(everything).items())
    assert got == want, (sorted((got - want).items())[:5], sorted((want - got).items())[:5])
