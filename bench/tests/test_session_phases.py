"""The session operator driver fires every session of its clicks once (no timing asserted)."""

from __future__ import annotations

import itertools
from pathlib import Path

from bench.session_phases import GAP_MS, clicks, run


def test_fires_each_session_of_the_clicks_once(tmp_path: Path) -> None:
    events = clicks(20_000, users=300)
    by_user: dict[str, list[int]] = {}
    for e in events:
        by_user.setdefault(e["user_id"], []).append(e["ts"])
    gaps = (b - a > GAP_MS for t in by_user.values() for a, b in itertools.pairwise(t))
    sessions = len(by_user) + sum(gaps)
    out = run(events, batch=512, barrier_every=3_000, work=tmp_path)
    assert out["fired"] == sessions
    assert out["checkpoints"] == 6
