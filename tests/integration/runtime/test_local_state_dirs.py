"""A kill -9 leaves its working state behind; the restart removes it, not only its own."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.helpers import DaemonProcess, check_pv_output, cli, make_pv_input, recount

pytestmark = pytest.mark.integration

#: Events in the input, read at most RATE a second: a run lasts >= 2 s, 40 checkpoints.
EVENTS, RATE = 200_000, 100_000


def _args(tmp_path: Path, inp: Path, local: Path) -> list[str]:
    return [
        "run", "apps.pv_count",
        "--set", f"checkpoint.dir={tmp_path / 'ckpt'}",
        "--set", f"app.input={inp}",
        "--set", f"app.output={tmp_path / 'out'}",
        "--set", f"state.local_dir={local}",
        "--set", "checkpoint.interval=50ms",
        "--set", "job.batch_size=256",
        "--set", "rest.enabled=false",
        # paced: the first run is still reading when it is killed, on any machine
        # (2 M events unpaced stood in for that: ~25 s of CPU, mostly the restart's)
        "--set", f"app.rate={RATE}",
    ]  # fmt: skip


def test_restart_after_kill9_removes_the_dead_workers_state(tmp_path: Path) -> None:
    inp = make_pv_input(tmp_path / "in.jsonl", EVENTS, keys=20_000)
    local = tmp_path / "local"
    with DaemonProcess(*_args(tmp_path, inp, local)) as d:
        d.wait_for("checkpoint 2 completed", timeout=120)
        os.kill(d.proc.pid, signal.SIGKILL)
        d.wait()
    left = list(local.glob("aiostream-state-*"))
    assert len(left) == 1 and any(left[0].rglob("data.mdb"))  # what the kill left behind
    r = cli(*_args(tmp_path, inp, local), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "working state left by a process that died" in r.stderr
    assert list(local.iterdir()) == []  # the dead worker's and its own, both gone
    assert check_pv_output(tmp_path / "out", recount(inp)).exact
