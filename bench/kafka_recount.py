"""Exactly-once on the Kafka path: each run's output topic read ``read_committed`` and recounted.

After each run the output topic is read ``read_committed`` and recounted
against the input (:func:`aiostream_ckpt_dev.recount.check_pv_updates`: each
key's committed updates are exactly 1..n in order), in a child process.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.systems import REPO
from bench.validation import Verdict


def recount_values(values: Iterable[bytes], expected: Any, malformed: int = 0) -> Verdict:
    """The read_committed output values checked with the project's recount, as a bench Verdict.

    >>> import collections
    >>> v = recount_values([b'{"app_id":"a","pv":1}', b'{"app_id":"a","pv":1}'],
    ...                    collections.Counter({"a": 1}))
    >>> v.passed, v.counts["records_out"]
    (False, 2)
    """
    from aiostream_ckpt_dev.recount import check_pv_updates

    records: list[dict[str, Any]] = []
    bad = 0
    for raw in values:
        try:
            rec = orjson.loads(raw)
        except orjson.JSONDecodeError:
            bad += 1
            continue
        if isinstance(rec, dict) and "app_id" in rec and "pv" in rec:
            records.append(rec)
        else:
            bad += 1
    v = check_pv_updates(records, expected, malformed=malformed, label="read_committed recount")
    counts = {
        "records_out": v.records + bad,
        "events_in": v.events,
        "keys": v.keys,
        "problems": len(v.problems),
        "malformed_out": bad,
    }
    passed = v.passed and bad == 0
    if passed:
        summary = "exactly-once"
    else:
        first = "; ".join(v.problems[:3])
        summary = f"{v.summary}" + (f", {bad} malformed records" if bad else "")
        summary += f" ({first})" if first else ""
    return Verdict("python", passed, counts, summary)


def _recount_main(argv: Sequence[str]) -> None:
    """Child-process entry: read one output topic read_committed, recount, print the verdict."""
    from aiostream_ckpt_dev.demo.kafka import read_topic_values
    from aiostream_ckpt_dev.recount import recount_inputs

    bootstrap, topic, input_path = argv
    expected, malformed = recount_inputs([Path(input_path)])
    values = asyncio.run(read_topic_values(bootstrap, topic))
    v = recount_values(values, expected, malformed)
    print("BENCH-RECOUNT " + json.dumps(v.to_json()), flush=True)


def recount_topic(bootstrap: str, topic: str, input_path: Path) -> Verdict:
    """:func:`recount_values` over the whole output topic, in a child process.

    A child, so the million values never enter the bench process: a worker
    forked from a big parent inherits its RSS as the start of ``ru_maxrss``.
    ``passed`` is None (unchecked, not refused) when the recount itself fails.
    """
    code = "import sys; from bench.kafka_recount import _recount_main; _recount_main(sys.argv[1:])"
    try:
        r = subprocess.run(
            [sys.executable, "-c", code, bootstrap, topic, str(input_path)],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=600,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Verdict("python", None, {}, "read_committed recount timed out after 600s")
    for line in r.stdout.splitlines():
        if line.startswith("BENCH-RECOUNT "):
            d = json.loads(line[len("BENCH-RECOUNT ") :])
            return Verdict("python", d["passed"], d["counts"], d["summary"])
    tail = " | ".join(r.stderr.strip().splitlines()[-3:])[-400:]
    return Verdict(
        "python", None, {}, f"read_committed recount failed (exit {r.returncode}): {tail}"
    )


def overall_verdict(passed: Sequence[bool | None]) -> bool | None:
    """False if any run's output failed the check, None if any went unchecked, else True.

    >>> overall_verdict([True, True]), overall_verdict([True, None]), overall_verdict([None, False])
    (True, None, False)
    """
    if any(p is False for p in passed):
        return False
    if any(p is None for p in passed):
        return None
    return True
