"""``savepoint stop``'s exit code says what happened, also run inside the daemon's PID namespace.

In a container the daemon is PID 1 and ``docker exec <c> aiostream-ckpt
savepoint stop`` runs in the same PID namespace: when PID 1 exits, the
kernel kills the client. Here the same relationship without Docker: the
daemon is PID 1 of a new PID namespace (``unshare --pid --fork
--mount-proc``) and the client enters that namespace (``nsenter --pid``).
Before the fix the client died with SIGKILL (exit 137 in a shell) in 2 of 3
runs although the savepoint and the stop had succeeded.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from aiostream_ckpt.checkpoint.storage import read_checkpoint
from tests.helpers import DaemonProcess, check_pv_output, cli, cli_cmd, generated_counts
from tests.integration.daemon.test_savepoints import EVENTS, KEYS, SPLITS, TOKEN, live, pv_args

pytestmark = pytest.mark.integration


def _namespaces_work() -> str | None:
    """Why a PID namespace cannot be made here (None: it can)."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "unshare/nsenter not installed"
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True
    )
    return None if probe.returncode == 0 else f"unshare --pid: {probe.stderr.strip()}"


def _init_pid(wrapper: int) -> int:
    """The daemon's host pid: the one child of ``unshare`` (PID 1 inside)."""
    with open(f"/proc/{wrapper}/task/{wrapper}/children") as f:
        (child,) = f.read().split()
    return int(child)


@pytest.mark.parametrize("round_", [1, 2, 3])
def test_stop_from_inside_the_daemons_pid_namespace_exits_0(tmp_path: Path, round_: int) -> None:
    reason = _namespaces_work()
    if reason is not None:
        pytest.skip(reason)
    args = pv_args(tmp_path / "ckpt", tmp_path / "out", 2, "--set", "app.rate=5000",
                   "--set", "rest.port=0")  # fmt: skip
    command = ["unshare", "--pid", "--fork", "--mount-proc", *cli_cmd(*args)]
    with DaemonProcess(command=command, env={"AIOSTREAM_REST__TOKEN": TOKEN}) as d:
        d.wait_for("checkpoint 2 completed")
        inside = ["nsenter", "--target", str(_init_pid(d.proc.pid)), "--pid", "--"]
        r = subprocess.run(
            [*inside, *cli_cmd("savepoint", "stop", "--url", d.url, "--token", TOKEN)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert d.wait() == 0, d.stderr[-3000:]
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    answer = orjson.loads(r.stdout)
    assert answer["job"] == "stopped_with_savepoint" and answer["output_committed"] is True
    assert read_checkpoint(Path(answer["path"])).is_savepoint
    assert d.summary()["status"] == "stopped_with_savepoint"
    # the stopped job's output is complete up to the savepoint, and resumes from it exactly
    rerun = cli(*pv_args(tmp_path / "ckpt", tmp_path / "out", 2, "--set", "rest.enabled=false"))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert check_pv_output(
        tmp_path / "out", generated_counts(EVENTS, splits=SPLITS, keys=KEYS)
    ).exact


def test_a_failed_savepoint_exits_3_and_the_job_goes_on(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with live(tmp_path / "ckpt", tmp_path / "out", 2, "--set", "app.rate=2000") as d:
        d.wait_for("checkpoint 2 completed")
        env = {"AIOSTREAM_REST__TOKEN": TOKEN}
        for action in ("stop", "trigger"):
            r = cli("savepoint", action, "--url", d.url, "--dir", str(blocker), env=env)
            assert r.returncode == 3, (action, r.returncode, r.stderr)
            assert "cannot create savepoint directory" in r.stderr
        refused = cli("savepoint", "stop", "--url", d.url, env={"AIOSTREAM_REST__TOKEN": "no"})
        assert refused.returncode == 1 and "(401)" in refused.stderr
        stop = cli("savepoint", "stop", "--url", d.url, env=env)
        assert stop.returncode == 0, stop.stderr
        assert d.wait() == 0
    gone = cli("savepoint", "stop", "--url", d.url, env=env)
    assert gone.returncode == 2 and "cannot reach the daemon" in gone.stderr
