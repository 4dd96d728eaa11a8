"""job.workers=2: a stop waits for the workers' sinks to commit before the main process exits.

The sinks run in the workers, so "committed" is what the workers confirm
after acting on the notification, not what the main process has sent. Real
processes (the daemon, its workers); the output is checked against a
recount of the generated input.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from aiostream_ckpt.checkpoint.storage import read_checkpoint
from aiostream_ckpt.connectors.staging import read_committed_output
from tests.helpers import DaemonProcess, check_pv_output, cli, generated_counts, generated_pv_args

pytestmark = pytest.mark.integration

TOKEN = "integration-token"
EVENTS, SPLITS, KEYS = 40_000, 2, 300
WORKERS = ("--set", "job.workers=2", "--set", "job.batch_size=256")


def pv_args(tmp_path: Path, *extra: str) -> list[str]:
    return generated_pv_args(
        tmp_path / "ckpt", tmp_path / "out", *WORKERS, *extra,
        events=EVENTS, splits=SPLITS, keys=KEYS,
    )  # fmt: skip


def live(tmp_path: Path, *extra: str) -> DaemonProcess:
    """A paced run (about 4 s of input) with the REST API on a free port."""
    args = pv_args(tmp_path, "--set", "app.rate=5000", "--set", "rest.port=0", *extra)
    return DaemonProcess(*args, env={"AIOSTREAM_REST__TOKEN": TOKEN})


def staged(out: Path) -> list[Path]:
    return sorted(out.glob(".part-*"))


def resume_exactly(tmp_path: Path, restored: str) -> None:
    r = cli(*pv_args(tmp_path, "--set", "rest.enabled=false"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert restored in r.stderr
    assert not (tmp_path / "out" / "_retracted").exists()
    check = check_pv_output(tmp_path / "out", generated_counts(EVENTS, splits=SPLITS, keys=KEYS))
    assert check.exact, (check.duplicates, check.missing, check.gaps[:3])


def test_stop_with_savepoint_exits_once_the_workers_committed(tmp_path: Path) -> None:
    with live(tmp_path) as d:
        d.wait_for("checkpoint 3 completed")
        status, sp = d.request("POST", "/job/stop-with-savepoint", token=TOKEN)
        assert status == 200, sp
        assert d.wait() == 0, d.stderr[-3000:]
        assert d.summary()["status"] == "stopped_with_savepoint"
    # the savepoint's output was committed in the workers before the main process exited
    assert not staged(tmp_path / "out"), "pre-committed output left staged after the stop"
    chk = read_checkpoint(Path(sp["path"]))
    read = sum(
        int(v)
        for st in chk.subtask_states("events").values()
        for v in st["operator"]["positions"].values()
    )
    assert 0 < read < EVENTS and len(list(read_committed_output(tmp_path / "out"))) == read
    resume_exactly(tmp_path, f"restoring from savepoint {sp['id']}")


def test_sigterm_with_a_final_checkpoint_exits_once_the_workers_committed(
    tmp_path: Path,
) -> None:
    with live(tmp_path, "--set", "shutdown.mode=checkpoint") as d:
        d.wait_for("checkpoint 3 completed")
        d.proc.send_signal(signal.SIGTERM)
        assert d.wait() == 0, d.stderr[-3000:]
        line = d.wait_for("shutdown: final checkpoint")
        assert "did not confirm" not in d.stderr
    final = int(line.split("final checkpoint ")[1].split()[0])
    assert not staged(tmp_path / "out"), "pre-committed output left staged after the stop"
    resume_exactly(tmp_path, f"restoring from checkpoint {final}")
