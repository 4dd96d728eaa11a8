"""An interrupted chaos run leaves no child behind, even one its Popen was starting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt_dev.chaos import kills
from tests.helpers import pids_with


def test_a_signal_inside_popen_does_not_orphan_the_started_child(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SIGTERM of the demo once the child exec'd, before Popen returned (CI, under load).

    Old code: ``proc`` was never set, the ``finally`` killed nothing, and the
    child ran on ("the worker was left running").
    """
    marker = f"chaos-orphan-{uuid.uuid4().hex}"
    real = subprocess.Popen
    started: list[subprocess.Popen[bytes]] = []

    def interrupted_popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append(real(*args, **kwargs))  # the child runs: exec done
        raise SystemExit(128 + signal.SIGTERM)  # the demo's SIGTERM handler, mid-Popen

    monkeypatch.setattr(kills.subprocess, "Popen", interrupted_popen)
    cmd = [sys.executable, "-c", "import time; time.sleep(60)", marker]
    try:
        with pytest.raises(SystemExit):
            kills.run_with_kills(cmd, kills=1, seed=0, log_path=tmp_path / "log")
        assert started and pids_with(marker) == [], "the started child was left running"
        assert started[0].poll() is not None  # reaped, not a zombie
    finally:
        for pid in pids_with(marker):
            os.kill(pid, signal.SIGKILL)
        for p in started:
            p.kill()
            p.wait()
