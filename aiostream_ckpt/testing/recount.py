"""Checking pv_count output against its input: Spark when available, else Python.

The Spark path is the proof (``aiostream_ckpt.validate``); the Python recount
is the same check for machines without Java/PySpark.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt.connectors.staging import read_committed_output


@dataclass
class Verdict:
    passed: bool
    events: int
    keys: int
    summary: str
    report: str


def python_recount(inputs: list[Path], output: Path) -> Verdict:
    expected: collections.Counter[str] = collections.Counter()
    malformed = 0
    for path in inputs:
        with open(path, "rb") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    event = orjson.loads(line)
                except orjson.JSONDecodeError:
                    malformed += 1
                    continue
                if isinstance(event, dict) and isinstance(event.get("app_id"), str):
                    expected[event["app_id"]] += 1
                else:
                    malformed += 1
    nxt: dict[str, int] = collections.defaultdict(lambda: 1)
    problems: list[str] = []
    records = 0
    for rec in read_committed_output(output):
        records += 1
        key, pv = rec["app_id"], rec["pv"]
        if pv != nxt[key]:
            problems.append(f"{key}: expected pv {nxt[key]}, got {pv}")
        nxt[key] = pv + 1
    for key, n in expected.items():
        if nxt[key] - 1 != n:
            problems.append(f"{key}: final pv {nxt[key] - 1}, input has {n}")
    extra = set(nxt) - set(expected)
    problems.extend(f"{k}: in output, not in input" for k in sorted(extra)[:20])
    events = sum(expected.values())
    summary = (
        f"{events} events in ({malformed} malformed), {records} records out, "
        f"{len(expected)} keys, {len(problems)} problems"
    )
    report = "python recount: " + summary + "".join(f"\n  {p}" for p in problems[:20])
    return Verdict(not problems and records == events, events, len(expected), summary, report)


def check_pv_count(inputs: list[Path], output: Path, *, use_spark: bool, work: Path) -> Verdict:
    if use_spark:
        try:
            from aiostream_ckpt.validate.cli import validate_main
        except ImportError:
            use_spark = False
    if not use_spark:
        return python_recount(inputs, output)
    import contextlib
    import io

    buf = io.StringIO()
    json_path = work / "validation.json"
    argv = ["--check", "pv_count", "--output-dir", str(output), "--json", str(json_path)]
    for p in inputs:
        argv += ["--input", str(p)]
    with contextlib.redirect_stdout(buf):
        code = validate_main(argv)
    text = buf.getvalue().strip()
    last = text.splitlines()[-1] if text else "validation: FAIL no output"
    report = orjson.loads(json_path.read_bytes()) if json_path.exists() else {}
    counts: dict[str, Any] = next(
        (r["counts"] for r in report.get("results", []) if "events_in" in r.get("counts", {})),
        {},
    )
    events = int(counts.get("events_in", 0)) - int(counts.get("malformed_in", 0))
    keys = int(counts.get("keys", 0))
    return Verdict(code == 0, events, keys, last, "spark " + text)
