"""kill -9 with typed keyed state: values read after a restore have the type they were written with.

Before, a ``datetime`` came back from a checkpoint as ``str`` and a ``tuple`` as
``list`` (a set failed at the checkpoint), so an app behaved differently after
recovery. ``tests/apps/typed_state.py`` emits, per event, the values and types
it read; the committed output must equal the failure-free run's.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt.connectors.staging import read_committed_output
from aiostream_ckpt_dev.chaos.kills import run_with_kills
from tests.apps import typed_state as app
from tests.helpers import REPO, cli_cmd

pytestmark = pytest.mark.integration


def test_state_types_survive_kill9(tmp_path: Path) -> None:
    rng = random.Random(7)
    events = [
        {"k": f"k{rng.randrange(50)}", "seq": i, "ts": 1_700_000_000_000 + i} for i in range(60_000)
    ]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    out = tmp_path / "out"
    cmd = cli_cmd(
        "run",
        "tests.apps.typed_state",
        "--set",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "--set",
        f"app.input={path}",
        "--set",
        f"app.output={out}",
        "--set",
        "checkpoint.interval=50ms",
        "--set",
        "job.batch_size=256",
    )
    log = tmp_path / "worker.log"
    result = run_with_kills(
        cmd, kills=3, seed=5, timeout=300, log_path=log, cwd=REPO, inputs=[path]
    )
    assert result.exit_code == 0, log.read_text()[-4000:]
    assert result.kills == 3, log.read_text()[-3000:]
    state: dict[str, dict[str, Any]] = {}
    want: Counter[tuple[str, int, str]] = Counter()
    for e in events:
        state[e["k"]], sig = app.step(state.get(e["k"], {}), e)
        want[(e["k"], e["seq"], sig)] += 1
    got = Counter((r["k"], r["seq"], r["sig"]) for r in read_committed_output(out))
    assert got == want, (sorted((got - want).items())[:3], sorted((want - got).items())[:3])
