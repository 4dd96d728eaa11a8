"""The demo's check: the Python recount is said at once, then Spark confirms, ticking.

In the Spark unit of the tests (tests/conftest.py): the check's SparkSession is
the one this worker's other Spark tests share.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from aiostream_ckpt_dev.recount import check_pv_count
from tests.helpers import REPO, cli_cmd, make_pv_input

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_the_check_says_the_python_recount_first_then_ticks_while_spark_runs(
    tmp_path: Path,
) -> None:
    """``make demo`` sat minutes in the Spark check printing nothing."""
    inp = make_pv_input(tmp_path / "in.jsonl", 2_000, keys=20)
    out = tmp_path / "out"
    done = subprocess.run(
        [*cli_cmd("run", "apps.pv_count"), "--set", f"app.input={inp}",
         "--set", f"app.output={out}", "--set", f"checkpoint.dir={tmp_path / 'c'}",
         "--set", "rest.enabled=false"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said: list[tuple[float, str]] = []
    verdict = check_pv_count(
        [inp], out, use_spark=True, work=tmp_path,
        echo=lambda line: said.append((time.monotonic(), line)), tick=1.0,
    )  # fmt: skip
    assert verdict.passed, verdict.report
    lines = [line for _, line in said]
    assert lines[0].startswith("check: python recount PASS: 2000 events in"), lines
    assert lines[1].startswith("check: confirming with Spark"), lines
    assert lines[-1].startswith("check: spark PASS"), lines
    ticks = [t for t, line in said if line.startswith("check: Spark still running")]
    # Spark's JVM takes seconds to start: the terminal heard from the check meanwhile
    assert ticks, lines
    assert "python recount" in verdict.report and "spark" in verdict.report
