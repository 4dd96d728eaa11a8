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
from tests.apps import typed_state as app
from tests.helpers import run_app_under_kills

pytestmark = pytest.mark.integration


def test_state_types_survive_kill9(tmp_path: Path) -> None:
    rng = random.Random(7)
    events = [
        {"k": f"k{rng.randrange(50)}", "seq": i, "ts": 1_700_000_000_000 + i} for i in range(45_000)
    ]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    out = tmp_path / "out"
    run_app_under_kills(
        tmp_path,
        "tests.apps.typed_state",
        # paced: a pass lasts >= 1.5 s, 30 checkpoint intervals, on any machine (60 k
        # events unpaced stood in for that); 7 blocks of input for the 3 kills
        [f"app.input={path}", f"app.output={out}", "app.rate=30000"],
        kills=3,
        seed=5,
        inputs=[path],
        batch_size=256,
    )
    state: dict[str, dict[str, Any]] = {}
    want: Counter[tuple[str, int, str]] = Counter()
    for e in events:
        state[e["k"]], sig = app.step(state.get(e["k"], {}), e)
        want[(e["k"], e["seq"], sig)] += 1
    got = Counter((r["k"], r["seq"], r["sig"]) for r in read_committed_output(out))
    assert got == want, (sorted((got - want).items())[:3], sorted((want - got).items())[:3])
