"""Exactly-once checks of pv_count output: a Python recount, and the project's Spark validator.

Both check the same thing: per key the committed values are exactly 1..n in
order, n being the key's count in the input. The Spark validator
(``aiostream_ckpt_dev.validate``) is preferred when it imports and its JVM starts;
all outputs are checked in one Spark session, after the timed runs, so the
JVM never competes with a measured worker for the two cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt.connectors.staging import read_committed_output


@dataclass
class Verdict:
    validator: str
    passed: bool | None
    counts: dict[str, int] = field(default_factory=dict)
    summary: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "counts": self.counts, "summary": self.summary}


def expected_counts(input_path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    loads = orjson.loads
    with open(input_path, "rb") as f:
        for line in f:
            if line.strip():
                k = loads(line)["app_id"]
                counts[k] = counts.get(k, 0) + 1
    return counts


def check_pv_records(
    records: Any, expected: dict[str, int], *, key: str = "app_id", value: str = "pv"
) -> Verdict:
    """Python recount over output records (iterable of dicts), in commit order.

    >>> v = check_pv_records([{"app_id": "a", "pv": 1}, {"app_id": "a", "pv": 1}], {"a": 1})
    >>> v.passed, v.counts["duplicates"]
    (False, 1)
    """
    last: dict[str, int] = {}
    c = {"records_out": 0, "duplicates": 0, "gaps": 0, "out_of_order": 0, "unexpected": 0}
    for r in records:
        c["records_out"] += 1
        k, n = r.get(key), r.get(value)
        if k not in expected or not isinstance(n, int) or n < 1 or n > expected[k]:
            c["unexpected"] += 1
            continue
        prev = last.get(k, 0)
        if n == prev + 1:
            last[k] = n
        elif n <= prev:
            c["duplicates" if n == prev or n < prev else "out_of_order"] += 1
        else:
            c["gaps"] += 1
            last[k] = n
    c["keys"] = len(expected)
    c["events_in"] = sum(expected.values())
    c["missing_keys"] = sum(1 for k, n in expected.items() if last.get(k, 0) != n)
    bad = {
        k: v
        for k, v in c.items()
        if k in ("duplicates", "gaps", "out_of_order", "unexpected", "missing_keys") and v
    }
    passed = not bad and c["records_out"] == c["events_in"]
    summary = (
        "exactly-once"
        if passed
        else ", ".join(f"{k}={v}" for k, v in bad.items())
        or (f"{c['records_out']} records for {c['events_in']} events")
    )
    return Verdict("python", passed, c, summary)


def python_recount(
    input_path: Path, output_dir: Path, expected: dict[str, int] | None = None
) -> Verdict:
    exp = expected if expected is not None else expected_counts(input_path)
    return check_pv_records(read_committed_output(output_dir), exp)


_SPARK_SCRIPT = r"""
import json, sys
from aiostream_ckpt_dev.validate import get_spark, pv_count_check, read_file_sink_output
from aiostream_ckpt_dev.validate.readers import read_kafka_output
jobs = json.loads(sys.argv[1])
spark = get_spark(kafka=any("kafka_topic" in job for job in jobs))
for job in jobs:
    try:
        if "kafka_topic" in job:
            out = read_kafka_output(spark, job["kafka_bootstrap"], job["kafka_topic"])
        else:
            out = read_file_sink_output(spark, job["output"])
        res = pv_count_check(spark, [job["input"]], out)
        print("BENCH-RESULT " + json.dumps({"id": job["id"], "passed": bool(res.passed),
              "counts": res.counts, "seconds": res.seconds}, default=str), flush=True)
    except Exception as exc:
        print("BENCH-RESULT " + json.dumps({"id": job["id"], "error": repr(exc)[:400]}), flush=True)
"""


def spark_available() -> str | None:
    """None when the Spark validator can be tried, else why not."""
    try:
        import pyspark  # noqa: F401

        import aiostream_ckpt_dev.validate  # noqa: F401
    except Exception as exc:
        return f"aiostream_ckpt_dev.validate not importable: {exc!r}"
    return None


def spark_validate(
    jobs: list[dict[str, str]], *, timeout: float = 900.0
) -> tuple[dict[str, Verdict], str | None]:
    """Check every ``{"id", "input", "output"}`` in one Spark session.

    A job with ``kafka_bootstrap`` and ``kafka_topic`` instead of ``output``
    reads that topic ``read_committed`` (Spark's Kafka source, fetched once).

    Returns verdicts by id and, when Spark itself could not run, the reason.
    """
    if not jobs:
        return {}, None
    why = spark_available()
    if why:
        return {}, why
    try:
        r = subprocess.run(
            [sys.executable, "-c", _SPARK_SCRIPT, json.dumps(jobs)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {}, f"Spark validation timed out after {timeout:.0f}s"
    verdicts: dict[str, Verdict] = {}
    for line in r.stdout.splitlines():
        if not line.startswith("BENCH-RESULT "):
            continue
        d = json.loads(line[len("BENCH-RESULT ") :])
        if "error" in d:
            verdicts[d["id"]] = Verdict("spark", None, {}, f"Spark check failed: {d['error']}")
            continue
        counts = {k: int(v) for k, v in d.get("counts", {}).items() if isinstance(v, int)}
        bad = {
            k: v
            for k, v in counts.items()
            if k
            in (
                "duplicates",
                "missing",
                "mismatched",
                "out_of_order",
                "unexpected",
                "malformed_out",
            )
            and v
        }
        summary = "exactly-once" if d["passed"] else ", ".join(f"{k}={v}" for k, v in bad.items())
        verdicts[d["id"]] = Verdict("spark", bool(d["passed"]), counts, summary)
    if not verdicts:
        tail = " | ".join((r.stderr or "").strip().splitlines()[-3:])
        return {}, f"Spark validator did not run (exit {r.returncode}): {tail[-500:]}"
    return verdicts, None
