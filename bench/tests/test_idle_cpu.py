"""The idle-CPU bench's rows: % of a core per process against the row's limit."""

from __future__ import annotations

from bench.idle_cpu import SITUATIONS, Situation, row, table


def test_a_row_judges_cpu_per_process_against_its_limit() -> None:
    idle = Situation("idle-2-workers", "apps.pv_count", {"job.workers": "2"}, 0, 2.0)
    r = row(idle, cpu_s=0.9, wall_s=20.0, processes=3)  # 4.5 % of a core over 3 processes
    assert (r["pct_of_core"], r["pct_per_process"], r["ok"]) == (4.5, 1.5, True)
    assert r["cpu_ms_per_1000_events"] is None
    over = row(idle, cpu_s=0.9, wall_s=20.0, processes=1)
    assert not over["ok"]
    (thousand,) = [s for s in SITUATIONS if s.name == "paced-1000"]
    paced = row(thousand, cpu_s=1.0, wall_s=20.0, processes=1)  # not judged
    assert paced["ok"] and paced["cpu_ms_per_1000_events"] == 50.0
    text = table([r, over, paced])
    assert "OVER" in text.splitlines()[2] and text.count("ok") == 2
