"""Windowed throughput rows: tumbling-window count and session windows on pv_count's input.

Ours runs ``apps/window_count.py`` on the same seeded file as the compare runs
(tumbling: 10 s windows per ``app_id``; sessions: 30 s gap per ``user_id``),
measured like them (input read position, steady window 10-90 %). Targets:
events/s at least half of pv_count's, and for sessions the rate over the last
10 % of the input within 10 % of the first 10 % (a cost that grows with a
key's history shows as a falling rate). Every run's output is checked against
the windows computed from the input by brute force: each window exactly once,
with its exact count.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt.connectors.staging import read_committed_output
from bench.results import RunResult
from bench.runner import Measured, measure, say
from bench.stats import steady_window
from bench.systems import Ours, Workload
from bench.validation import Verdict

TUMBLING_MS = 10_000
SESSION_GAP_MS = 30_000
KINDS = {
    "tumbling": ["app.window=tumbling", f"app.size={TUMBLING_MS}"],
    "session": ["app.window=session", f"app.gap={SESSION_GAP_MS}"],
}
#: Targets: events/s against pv_count's, and the last 10 % of a session run against its first.
TARGET_X_PV_COUNT = 0.5
TARGET_LAST_VS_FIRST = 0.9


def expected_windows(input_path: Path, kind: str) -> Counter[tuple[str, int, int]]:
    """``(key, start, end) -> count`` of every window the input makes, by brute force."""
    events: list[tuple[str, int]] = []
    field = "app_id" if kind == "tumbling" else "user_id"
    with open(input_path, "rb") as f:
        for line in f:
            if line.strip():
                e = orjson.loads(line)
                events.append((e[field], int(e["ts"])))
    out: Counter[tuple[str, int, int]] = Counter()
    if kind == "tumbling":
        for key, ts in events:
            start = ts - ts % TUMBLING_MS
            out[(key, start, start + TUMBLING_MS)] += 1
        return out
    by_key: dict[str, list[int]] = {}
    for key, ts in events:
        by_key.setdefault(key, []).append(ts)
    for key, stamps in by_key.items():
        stamps.sort()
        start = last = stamps[0]
        n = 0
        for ts in stamps:
            if ts > last + SESSION_GAP_MS:  # touching sessions merge, as Flink's do
                out[(key, start, last + SESSION_GAP_MS)] = n
                start, n = ts, 0
            n += 1
            last = ts
        out[(key, start, last + SESSION_GAP_MS)] = n
    return out


def check_windows(output_dir: Path, expected: Counter[tuple[str, int, int]]) -> Verdict:
    """Each expected window committed exactly once with its count; nothing else."""
    seen: Counter[tuple[str, int, int]] = Counter()
    wrong = 0
    for r in read_committed_output(output_dir):
        w = (r["key"], r["start"], r["end"])
        seen[w] += 1
        if expected.get(w) != r["count"]:
            wrong += 1
    c = {
        "windows_expected": len(expected),
        "windows_out": sum(seen.values()),
        "duplicates": sum(n - 1 for n in seen.values() if n > 1),
        "missing": sum(1 for w in expected if w not in seen),
        "wrong_count": wrong,
    }
    bad = {k: v for k, v in c.items() if k in ("duplicates", "missing", "wrong_count") and v}
    summary = "exactly-once" if not bad else ", ".join(f"{k}={v}" for k, v in bad.items())
    return Verdict("python", not bad, c, summary)


def first_last_rates(progress: list[tuple[float, float]], total: float) -> tuple[float, float]:
    """Events/s over the first and the last 10 % of the input (from the progress series).

    The last 10 % ends when the input is all read: the samples after the
    position first reached ``total`` (the end-of-input drain: the last
    watermark fires every open window, the final checkpoint, the exit) are
    no part of it. They were: the window ran to the last sample, so a
    run's shutdown counted as its last 10 % (session rows read 0.08).
    """
    pts = sorted(progress)
    done = next((i for i, (_, v) in enumerate(pts) if v >= total), None)
    if done is not None:
        pts = pts[: done + 1]
    first = steady_window(pts, total, lo=0.005, hi=0.1)
    last = steady_window(pts, total, lo=0.9, hi=1.0)
    return (first.rate if first else 0.0), (last.rate if last else 0.0)


def windowed_rows(
    wl: Workload, work: Path, *, repeats: int, spec_args: dict[str, Any], pv: RunResult | None
) -> list[Measured]:
    """Measure both window kinds; annotate each with its ratio to pv_count (and trend)."""
    out = []
    for kind, sets in KINDS.items():
        say(f"windowed: expected {kind} windows from the input ...")
        expected = expected_windows(wl.paths[0], kind)
        m = measure(
            Ours(),
            wl,
            work,
            experiment=f"windows={kind}",
            repeats=repeats,
            spec_args={
                **spec_args,
                "app": "apps.window_count",
                "sets": [*spec_args.get("sets", []), *sets],
            },
            check=lambda _input, output, expected=expected: check_windows(output, expected),
            keep_outputs=False,
        )
        annotate(m.result, kind, pv)
        out.append(m)
    prove_sessions(out, work)
    return out


def prove_sessions(rows: list[Measured], work: Path) -> None:
    """Prove the windowed app under kill -9 (the demos' check) and put the verdict on each row.

    The rows above check window counts without failures; this runs
    ``apps.sessions`` under 2 kill -9 at checkpoint windows and compares every
    output with a failure-free run (:mod:`aiostream_ckpt_dev.demo.windowed`).
    """
    from aiostream_ckpt_dev.demo.windowed import prove_windowed

    say("windowed: proving apps.sessions under kill -9 (chaos, reference-run proof) ...")
    verdict = prove_windowed("windowed", work / "windowed-proof", seed=7)
    proof = {"verdict": verdict.line(), "passed": verdict.passed, "problems": verdict.problems}
    proof["assumptions"] = verdict.assumptions
    for m in rows:
        m.result.config.setdefault("windowed", {})["proof"] = proof


def annotate(res: RunResult, kind: str, pv: RunResult | None) -> None:
    """Put the ratio to pv_count and the first/last 10 % rates into ``config["windowed"]``."""
    if res.status != "ok" or not res.events_per_s or not res.events:
        return
    fig: dict[str, Any] = {"window": kind, "target_x_pv_count": TARGET_X_PV_COUNT}
    if pv is not None and pv.events_per_s:
        fig["pv_count_events_per_s"] = round(pv.events_per_s)
        fig["x_pv_count"] = round(res.events_per_s / pv.events_per_s, 3)
    progress = res.series.get("progress") or []
    first, last = first_last_rates([(t, float(v)) for t, v in progress], float(res.events))
    fig["first_10pct_events_per_s"] = round(first)
    fig["last_10pct_events_per_s"] = round(last)
    fig["last_vs_first"] = round(last / first, 3) if first else None
    if kind == "session":
        fig["target_last_vs_first"] = TARGET_LAST_VS_FIRST
    res.config["windowed"] = fig
    say(
        f"  {kind}: {fig.get('x_pv_count', '-')}x pv_count; first/last 10 %: "
        f"{first:,.0f} / {last:,.0f} events/s"
    )
