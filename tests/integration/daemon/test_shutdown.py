"""SIGTERM: each ``shutdown.mode`` stops cleanly (exit 0) and the job resumes exactly."""

from __future__ import annotations

import collections
import shutil
import signal
from pathlib import Path

import orjson
import pytest

from tests.helpers import DaemonProcess, check_pv_output, cli, generated_counts, generated_pv_args

pytestmark = pytest.mark.integration

EVENTS, SPLITS, KEYS = 60_000, 2, 300


def pv_args(ckpt: Path, out: Path, *extra: str) -> list[str]:
    return generated_pv_args(ckpt, out, *extra, events=EVENTS, splits=SPLITS, keys=KEYS)


def sigterm(tmp_path: Path, mode: str, *extra: str) -> DaemonProcess:
    d = DaemonProcess(
        *pv_args(tmp_path / "ckpt", tmp_path / "out", "--set", "app.rate=5000"),
        "--set",
        "rest.port=0",
        "--set",
        f"shutdown.mode={mode}",
        *extra,
    )
    d.wait_for("checkpoint 3 completed")
    d.proc.send_signal(signal.SIGTERM)
    assert d.wait() == 0, d.stderr[-3000:]
    assert f"stop requested by signal (shutdown.mode={mode})" in d.stderr
    # the job ended as the mode says: a savepoint stop, or a cancel after a checkpoint
    ended = "stopped_with_savepoint" if mode == "savepoint" else "canceled"
    assert d.summary()["status"] == ended
    return d


def expected() -> collections.Counter[str]:
    return generated_counts(EVENTS, splits=SPLITS, keys=KEYS)


def resume(tmp_path: Path, ckpt: Path, out: Path, *extra: str) -> str:
    r = cli(*pv_args(ckpt, out, "--set", "rest.enabled=false"), *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stderr


def test_cancel_mode_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    sigterm(tmp_path, "cancel")
    log = resume(tmp_path, tmp_path / "ckpt", tmp_path / "out")
    assert "restoring from checkpoint" in log
    assert check_pv_output(tmp_path / "out", expected()).exact


def test_checkpoint_mode_commits_a_final_checkpoint(tmp_path: Path) -> None:
    d = sigterm(tmp_path, "checkpoint")
    line = d.wait_for("shutdown: final checkpoint")
    final = int(line.split("final checkpoint ")[1].split()[0])
    assert d.summary()["last_checkpoint"] == final
    # everything pre-committed up to the final checkpoint was committed before exit
    assert not list((tmp_path / "out").glob(".*.pending"))
    log = resume(tmp_path, tmp_path / "ckpt", tmp_path / "out")
    assert f"restoring from checkpoint {final}" in log
    assert check_pv_output(tmp_path / "out", expected()).exact


def test_savepoint_mode_stops_with_savepoint_and_logs_json(tmp_path: Path) -> None:
    d = sigterm(
        tmp_path, "savepoint", "--set", f"savepoint.dir={tmp_path / 'sps'}", "--log-format", "json"
    )
    lines = d.stderr.strip().splitlines()
    entries = [orjson.loads(line) for line in lines[:-1]]  # the last line is the summary
    assert all({"ts", "level", "logger", "msg"} <= set(e) for e in entries)
    msgs = [e["msg"] for e in entries]
    savepoint = Path(d.summary()["savepoint"])
    assert savepoint.parent == tmp_path / "sps"
    assert any(m.startswith("savepoint ") and f"stored at {savepoint}" in m for m in msgs)
    assert any(m.startswith("checkpoint ") and " completed in " in m for m in msgs)
    out = tmp_path / "restored-out"
    shutil.copytree(tmp_path / "out", out)
    log = resume(tmp_path, tmp_path / "ckpt2", out, "--from-savepoint", str(savepoint))
    assert "restoring from savepoint" in log
    assert check_pv_output(out, expected()).exact
