"""``aiostream-ckpt demo`` where the image runs it: no Java, unwritable cwd, PID 1, image ENV."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from aiostream_ckpt_dev.demo.files import make_workdir, worker_env
from aiostream_ckpt_dev.recount import check_pv_count
from tests.helpers import REPO, cli_cmd, make_pv_input, pids_with

pytestmark = pytest.mark.integration


def test_workdir_falls_back_to_the_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir("/proc")  # nobody, root included, may create /proc/.demo
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert make_workdir(None) == tmp_path / "aiostream-demo"
    assert (tmp_path / "aiostream-demo").is_dir()


def test_worker_does_not_inherit_the_image_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIOSTREAM_APP__GENERATE", "1000000000")
    monkeypatch.setenv("AIOSTREAM_CHECKPOINT__DIR", "/var/lib/aiostream/checkpoints")
    env = worker_env()
    assert not [k for k in env if k.startswith("AIOSTREAM_")]
    assert env["PATH"] == os.environ["PATH"]


def test_spark_check_without_java_is_declared_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked for Spark with no Java: the Python recount decides and the report says why."""
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    inp = make_pv_input(tmp_path / "in.jsonl", 100, keys=5)
    out = tmp_path / "out"
    out.mkdir()  # no output at all: the recount must fail it, not a Spark "pass"
    verdict = check_pv_count([inp], out, use_spark=True, work=tmp_path)
    assert verdict.report.startswith(f"spark check skipped: JAVA_HOME={tmp_path / 'no-jdk'}")
    assert "python recount" in verdict.report
    assert not verdict.passed


def _wait_for_line(proc: subprocess.Popen[str], text: str, timeout: float = 120) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        if text in line:
            return
        assert time.monotonic() < deadline, f"no {text!r}"
    raise AssertionError(f"demo ended before {text!r}")


def _demo_args(work: Path) -> list[str]:
    # paced so the demo is still running when the signal comes
    return ["demo", "--events", "1000000", "--kills", "1", "--no-spark", "--workdir", str(work)]


def test_sigterm_stops_the_demo_and_its_worker(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    proc = subprocess.Popen(cli_cmd(*_demo_args(work)), stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        _wait_for_line(proc, "SIGKILL x1")
        deadline = time.monotonic() + 60
        while not pids_with(str(work / "checkpoints")):
            assert time.monotonic() < deadline, "no worker"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 128 + signal.SIGTERM
        assert pids_with(str(work / "checkpoints")) == [], "the worker was left running"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_sigterm_stops_the_demo_as_pid_1(tmp_path: Path) -> None:
    """As in a container without --init: PID 1 of a PID namespace, signalled from outside."""
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a PID namespace here: {probe.stderr.decode().strip()}")
    work = tmp_path / "demo"
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m"]
    cmd += ["aiostream_ckpt.daemon.cli", *_demo_args(work)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        _wait_for_line(proc, "SIGKILL x1")
        (demo_pid,) = [
            pid for pid in pids_with("--workdir") if pid != proc.pid and str(work).encode() in
            Path(f"/proc/{pid}/cmdline").read_bytes() and b"unshare" not in
            Path(f"/proc/{pid}/cmdline").read_bytes()
        ]  # fmt: skip
        os.kill(demo_pid, signal.SIGTERM)  # what docker stop does
        assert proc.wait(timeout=15) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.spark
def test_the_delta_demo_is_proven_by_spark(tmp_path: Path) -> None:
    """``make demo-delta``, small: kill -9 twice, then the recount and Spark's proof pass."""
    proc = subprocess.run(
        cli_cmd(
            "demo", "--sink", "delta", "--events", "60000", "--keys", "50", "--kills", "2",
            "--interval", "100ms", "--windowed-kills", "0", "--workdir", str(tmp_path / "demo"),
            "--seed", "5",
        ),
        capture_output=True, text=True, timeout=900, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "spark path" in proc.stdout and "spark proof skipped" not in proc.stdout
    assert "exactly-once verified" in proc.stdout
    assert (tmp_path / "demo" / "output" / "_delta_log").is_dir()
