"""One owner per directory, between real processes.

A supervisor and a person restarting a killed job at the same moment used to
run two jobs on one checkpoint directory, both restoring the same checkpoint
and overwriting each other's output. A second job on any directory the first
one writes is now refused at its start, naming the owner; a kill -9'd owner
never blocks its successor (the kernel drops its lock).
"""

from __future__ import annotations

import collections
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import DaemonProcess, check_pv_output, cli, generated_pv_args, newest_checkpoint

pytestmark = pytest.mark.integration


def _args(ckpt: Path, out: Path, *extra: str) -> list[str]:
    """pv_count that runs until stopped (a slow, endless generator) with a free REST port."""
    return generated_pv_args(
        ckpt, out, "--set", "app.rate=2000", "--set", "rest.port=0", *extra, events=10**9
    )


def _owned_by(pid: int) -> str:
    return f"is in use by job 'pv_count' (pid {pid} on host {socket.gethostname()} since "


def _first_to_exit(*procs: DaemonProcess, timeout: float = 60) -> DaemonProcess:
    """The first child to end (the others run on)."""
    deadline = time.monotonic() + timeout
    while True:
        for p in procs:
            try:
                p.proc.wait(timeout=0.05)
                return p
            except subprocess.TimeoutExpired:
                pass
        assert time.monotonic() < deadline, "no child ended"


def _stop_and_check(owner: DaemonProcess, out: Path) -> None:
    """SIGTERM the owner; its committed output counts every key 1..n exactly once."""
    owner.proc.send_signal(signal.SIGTERM)
    assert owner.wait() == 0, owner.stderr[-3000:]
    check = check_pv_output(out, collections.Counter())
    assert check.records > 0
    assert check.duplicates == 0
    assert check.records == sum(check.final.values())  # no gaps: 1..n per key


def test_of_two_successors_of_a_killed_owner_one_runs_and_the_other_is_refused(
    tmp_path: Path,
) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    args = _args(ckpt, out)
    with DaemonProcess(*args) as first:
        first.wait_for("checkpoint 2 completed")
        first.proc.kill()
        first.wait()
    restored = newest_checkpoint(ckpt)
    assert restored >= 2
    # started together, as a supervisor and a person restarting by hand would
    with DaemonProcess(*args) as b, DaemonProcess(*args) as c:
        refused = _first_to_exit(b, c)
        ran = c if refused is b else b
        assert refused.wait() == 2, refused.stderr[-3000:]
        last = refused.stderr.strip().splitlines()[-1]
        assert last.startswith(f"aiostream-ckpt: error: the checkpoint directory {ckpt} "), last
        assert _owned_by(ran.proc.pid) in last, last
        assert "restoring from" not in refused.stderr  # refused before restoring anything
        # the successor of the killed owner resumed and runs on
        ran.wait_for(f"restoring from checkpoint {restored} (")
        ran.wait_for(" completed in ")
        assert ran.proc.poll() is None
        _stop_and_check(ran, out)


@pytest.mark.parametrize("shared", ["output", "dead_letter"])
def test_a_second_job_on_a_directory_of_a_running_one_is_refused(
    tmp_path: Path, shared: str
) -> None:
    """Different checkpoint directories, one output (or dead-letter) directory: refused."""

    def job(name: str) -> list[str]:
        out = tmp_path / ("out" if shared == "output" else f"out-{name}")
        dead_letters = tmp_path / ("dead-letters" if shared == "dead_letter" else f"dl-{name}")
        return _args(
            tmp_path / f"ckpt-{name}", out, "--set", f"errors.dead_letter_dir={dead_letters}"
        )

    with DaemonProcess(*job("a")) as a:
        a.wait_for("checkpoint 1 completed")
        second = cli(*job("b"))
        assert second.returncode == 2, second.stderr[-3000:]
        last = second.stderr.strip().splitlines()[-1]
        if shared == "output":
            where = f"the output directory of sink 'pv-sink' {tmp_path / 'out'} "
        else:
            where = (
                f"the dead-letter directory (errors.dead_letter_dir) {tmp_path / 'dead-letters'} "
            )
        assert where in last, last
        assert _owned_by(a.proc.pid) in last, last
        assert a.proc.poll() is None  # the owner runs on, untouched
        _stop_and_check(a, tmp_path / ("out" if shared == "output" else "out-a"))
