"""Fail points: parsing, disarmed no-ops, and a kill at exactly the armed hit."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from aiostream_ckpt import failpoints
from aiostream_ckpt.errors import ConfigError
from tests.helpers import REPO


def test_parse_names_every_bad_part() -> None:
    assert failpoints.parse("") == {}
    assert failpoints.parse("sink_commit=kill@2, restore_begin=kill") == {
        "sink_commit": 2,
        "restore_begin": 1,
    }
    with pytest.raises(ConfigError, match="unknown fail point 'sink_comit'"):
        failpoints.parse("sink_comit=kill")
    for bad in ("sink_commit=stop", "sink_commit=kill@0", "sink_commit=kill@x"):
        with pytest.raises(ConfigError, match="'kill' or 'kill@N'"):
            failpoints.parse(bad)


def test_disarmed_and_other_points_do_nothing() -> None:
    failpoints.disarm()
    for name in failpoints.POINTS:
        failpoints.hit(name)  # no kill: this test process goes on
    failpoints.arm({"final_committed": 1})
    try:
        failpoints.hit("sink_commit")
    finally:
        failpoints.disarm()


def test_kills_the_process_at_the_nth_hit() -> None:
    code = (
        "from aiostream_ckpt import failpoints\n"
        "failpoints.arm_from_env()\n"
        "for i in range(5):\n"
        "    print(i, flush=True)\n"
        "    failpoints.hit('metadata_durable')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"AIOSTREAM_FAILPOINTS": "metadata_durable=kill@3", "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["0", "1", "2"]
    assert "failpoint metadata_durable: SIGKILL at hit 3" in done.stderr


def test_cli_refuses_a_bad_spec() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "aiostream_ckpt.daemon.cli", "run", "apps.pv_count"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"AIOSTREAM_FAILPOINTS": "nowhere=kill", "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.returncode == 2
    assert "unknown fail point 'nowhere'" in done.stderr
