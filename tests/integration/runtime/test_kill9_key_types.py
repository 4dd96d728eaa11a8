"""kill -9 with keys of declared types: an enum and a date key come back as themselves.

Undeclared, such keys are refused (they would come back from a checkpoint as
``str``). ``tests/apps/typed_keys.py`` declares them (``key_by(...,
key_type=Color)``, ``key_type=date``) and names the type of every key the
engine hands it: in ``process_element``, in ``on_timer`` (timers restored from
the checkpoint) and in window results; the committed output must equal the
failure-free run's, state (the per-color counts) included.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt.connectors.staging import read_committed_output
from tests.apps.typed_keys import Color, described
from tests.helpers import run_app_under_kills

pytestmark = pytest.mark.integration

BASE = 1_700_000_000_000
DAYS = [date(2024, 2, 28), date(2024, 2, 29), date(2024, 3, 1)]


def test_enum_and_date_keys_survive_kill9(tmp_path: Path) -> None:
    rng = random.Random(3)
    events = [
        {
            "color": rng.choice(list(Color)).value,
            "day": rng.choice(DAYS).isoformat(),
            "seq": i,
            "ts": BASE + 2 * i,
        }
        for i in range(30_000)
    ]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    out = tmp_path / "out"
    run_app_under_kills(
        tmp_path,
        "tests.apps.typed_keys",
        # paced: a pass lasts >= 1.5 s, 30 checkpoint intervals, on any machine
        [f"app.input={path}", f"app.output={out}", "app.rate=20000"],
        kills=3,
        seed=11,
        inputs=[path],
        batch_size=256,
    )
    want: Counter[tuple[Any, ...]] = Counter()
    counts: Counter[Color] = Counter()
    timers: set[tuple[str, int]] = set()
    windows: Counter[tuple[str, int]] = Counter()
    for e in events:
        color, ts = Color(e["color"]), e["ts"]
        counts[color] += 1
        want[("event", described(color), e["seq"], counts[color])] += 1
        timers.add((described(color), ts - ts % 1000 + 999))
        windows[(described(date.fromisoformat(e["day"])), ts - ts % 2_000)] += 1
    want.update(("timer", key, at) for key, at in timers)
    want.update(("window", key, start, n) for (key, start), n in windows.items())
    got: Counter[tuple[Any, ...]] = Counter()
    for r in read_committed_output(out):
        if r["kind"] == "event":
            got[("event", r["key"], r["seq"], r["n"])] += 1
        elif r["kind"] == "timer":
            got[("timer", r["key"], r["at"])] += 1
        else:
            got[("window", r["key"], r["start"], r["n"])] += 1
    assert got == want, (sorted((got - want).items())[:3], sorted((want - got).items())[:3])
