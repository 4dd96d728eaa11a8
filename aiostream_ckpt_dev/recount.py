"""Checking pv_count output against its input: Spark when available, else Python.

The Spark path is the proof (``aiostream_ckpt_dev.validate``); the Python recount
is the same check for machines without Java/PySpark, and the one place that
defines it for the demos and tests: an input line counts when it is a JSON
object with a string ``app_id`` (everything else is dead-lettered by the job),
and each key's committed updates must be exactly ``1..n``.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import io
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
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
    records: int = 0
    problems: list[str] = field(default_factory=list)


def recount_inputs(paths: Iterable[Path]) -> tuple[collections.Counter[str], int]:
    """Events per ``app_id`` in JSON-lines inputs, and how many lines are malformed."""
    expected: collections.Counter[str] = collections.Counter()
    malformed = 0
    for path in paths:
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
    return expected, malformed


def check_pv_updates(
    updates: Iterable[dict[str, Any]],
    expected: collections.Counter[str],
    *,
    malformed: int = 0,
    label: str = "python recount",
) -> Verdict:
    """Each key's updates, in commit order, must be exactly ``1..n`` for its ``n`` inputs."""
    nxt: dict[str, int] = collections.defaultdict(lambda: 1)
    problems: list[str] = []
    records = 0
    for rec in updates:
        records += 1
        key, pv = rec["app_id"], rec["pv"]
        if pv != nxt[key]:
            problems.append(f"{key}: expected pv {nxt[key]}, got {pv}")
        nxt[key] = max(nxt[key], pv + 1)
    for key, n in expected.items():
        if nxt[key] - 1 != n:
            problems.append(f"{key}: final pv {nxt[key] - 1}, input has {n}")
    problems.extend(f"{k}: in output, not in input" for k in sorted(set(nxt) - set(expected))[:20])
    events = sum(expected.values())
    summary = (
        f"{events} events in ({malformed} malformed), {records} records out, "
        f"{len(expected)} keys, {len(problems)} problems"
    )
    report = f"{label}: {summary}" + "".join(f"\n  {p}" for p in problems[:20])
    passed = not problems and records == events
    return Verdict(passed, events, len(expected), summary, report, records, problems)


def python_recount(inputs: list[Path], output: Path) -> Verdict:
    """Recount in Python; a Delta table or Parquet output is read as its readers see it."""
    from aiostream_ckpt_dev.validate.tables import table_records

    expected, malformed = recount_inputs(inputs)
    table = table_records(output)
    records = (r for r, _ in table) if table is not None else read_committed_output(output)
    return check_pv_updates(records, expected, malformed=malformed)


def spark_unavailable() -> str | None:
    """Why the Spark check cannot run here (PySpark or Java missing), or None when it can."""
    if importlib.util.find_spec("pyspark") is None:
        return "PySpark is not installed (pip install 'aiostream-ckpt[validate]')"
    from aiostream_ckpt_dev.validate.errors import ValidationConfigError
    from aiostream_ckpt_dev.validate.session import find_java

    try:
        find_java()
    except ValidationConfigError as exc:
        return str(exc)
    return None


def check_pv_count(
    inputs: list[Path],
    output: Path,
    *,
    use_spark: bool,
    work: Path,
    echo: Callable[[str], None] | None = None,
    tick: float = 10.0,
) -> Verdict:
    """Check with the Python recount first, then with Spark as confirmation when asked and possible.

    The recount takes seconds and is said at once (``echo``); Spark's JVM takes
    a minute to start, so while it runs a line every ``tick`` seconds says it
    is still working instead of leaving the terminal silent. Both must pass.
    The report names the checks that ran and, when Spark was asked for but
    cannot run, why it was skipped: a pass never claims a Spark check that did
    not happen. A failed recount skips Spark: it cannot turn a fail into a pass.
    """
    say = echo or (lambda _line: None)
    started = time.monotonic()
    quick = python_recount(inputs, output)
    say(
        f"check: python recount {'PASS' if quick.passed else 'FAIL'}: {quick.summary} "
        f"({time.monotonic() - started:.1f}s)"
    )
    skipped = spark_unavailable() if use_spark else None
    if skipped is not None:
        quick.report = f"spark check skipped: {skipped}\n{quick.report}"
    if not use_spark or skipped is not None or not quick.passed:
        return quick
    say("check: confirming with Spark (validate --check pv_count; its JVM starts first)")
    with _ticking(say, tick, "check: Spark still running"):
        spark = _spark_verdict(inputs, output, work)
    say(f"check: spark {'PASS' if spark.passed else 'FAIL'} ({time.monotonic() - started:.0f}s)")
    spark.report = f"{quick.report}\n{spark.report}"
    return spark


@contextlib.contextmanager
def _ticking(say: Callable[[str], None], every: float, what: str) -> Iterator[None]:
    """Say ``what`` and the time taken every ``every`` seconds until the block ends."""
    done = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        while not done.wait(every):
            say(f"{what} ({time.monotonic() - started:.0f}s)")

    thread = threading.Thread(target=tick, name="check-ticker", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _spark_verdict(inputs: list[Path], output: Path, work: Path) -> Verdict:
    from aiostream_ckpt_dev.validate.cli import validate_main

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
