"""Working state lives in ``state.local_dir``, owned by the job: never in the temp dir.

Every kill -9 used to leave its working LMDB copy in ``/tmp/aiostream-state-*``,
and a container with a read-only root could not run at all.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import (
    REPO,
    DaemonProcess,
    check_pv_output,
    generated_counts,
    generated_pv_args,
    newest_checkpoint,
)

pytestmark = pytest.mark.integration


def test_a_rerun_after_kill9_wipes_the_dead_runs_state_and_nothing_goes_to_temp(
    tmp_path: Path,
) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {"TMPDIR": str(temp)}  # the process's temp dir, to see what lands there
    ckpt = tmp_path / "ckpt"
    args = generated_pv_args(
        ckpt, tmp_path / "out", "--set", "app.rate=2000", "--set", "rest.port=0", events=10**9
    )
    local = ckpt / "local-state"  # the documented default
    with DaemonProcess(*args, env=env) as first:
        first.wait_for("checkpoint 2 completed")
        first.proc.kill()
        first.wait()
    (dead,) = local.glob("aiostream-state-*")
    assert any(dead.rglob("data.mdb"))  # the killed run's working LMDB copies
    restored = newest_checkpoint(ckpt)
    assert restored >= 2

    with DaemonProcess(*args, env=env) as second:
        second.wait_for(f"restoring from checkpoint {restored} (")
        second.wait_for(" completed in ")
        assert not dead.exists()  # removed at start
        (live,) = local.iterdir()  # this run's state, nothing else
        assert live.name.startswith("aiostream-state-") and any(live.rglob("data.mdb"))
        second.proc.send_signal(signal.SIGTERM)
        assert second.wait() == 0, second.stderr[-3000:]
    assert list(local.iterdir()) == []  # an attempt removes its working state when it ends
    assert list(temp.iterdir()) == []


def test_a_read_only_root_with_a_writable_checkpoint_volume_runs(tmp_path: Path) -> None:
    """The job in a mount namespace where only ``tmp_path`` (the volume) is writable."""
    volume = tmp_path / "volume"
    volume.mkdir()
    events = 20_000
    cmd = [
        sys.executable,
        "-m",
        "aiostream_ckpt.daemon.cli",
        *generated_pv_args(
            volume / "ckpt", volume / "out", "--set", "rest.enabled=false", events=events
        ),
    ]
    script = (
        f"mount --make-rprivate / && mount --bind {shlex.quote(str(volume))} "
        f"{shlex.quote(str(volume))} && mount -o remount,bind,ro / && "
        "if touch /tmp/.aiostream-ro-probe 2>/dev/null; then exit 99; fi; "
        f"exec {shlex.join(cmd)}"
    )
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here (needs root): {probe.stderr.strip()}")
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert r.returncode != 99, "the root did not become read-only"
    assert r.returncode == 0, r.stderr[-3000:]
    check = check_pv_output(volume / "out", generated_counts(events, splits=2, keys=300))
    assert check.exact, (check.duplicates, check.missing, check.gaps[:3])
    assert check.records == events
