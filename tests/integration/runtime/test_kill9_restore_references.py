"""kill -9 around the first checkpoint after a restore, which references the restored files.

That checkpoint writes only the changes since the restore; its chain starts
with the restored checkpoint's files. Each run of the job is killed by a fail
point in one window, and the next restarts on the same directories: between
the restore and the first checkpoint, while that checkpoint writes its delta
(not yet fsynced), and right after its metadata is durable (before any sink
committed). Each restart must restore the checkpoint the window left as the
newest (the restored one until the new metadata is durable, then the new one),
none is set aside, every chain file of a retained checkpoint still exists and
is kept by retention, and the output of the final run is exact. With worker
processes the snapshots, restores and pins are the workers' (retention asks
them for their pins): the windows of the main process are killed there.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.checkpoint.storage import CheckpointStorage, read_checkpoint
from tests.helpers import REPO, check_pv_output, cli_cmd, generated_counts, generated_pv_args

pytestmark = pytest.mark.integration

EVENTS, KEYS, SPLITS = 4000, 40, 2


def _handles(ckpt: Path, cid: int) -> dict[str, dict[str, Any]]:
    chk = read_checkpoint(CheckpointStorage(ckpt, create=False).checkpoint_dir(cid))
    return {s: st["keyed"] for s, st in chk.operators["pv-count"]["subtasks"].items()}


def _unprotected_files(ckpt: Path) -> dict[int, list[str]]:
    """Chain files of completed checkpoints that are missing or that retention would not keep."""
    storage = CheckpointStorage(ckpt, create=False)
    out: dict[int, list[str]] = {}
    for cid in storage.completed_newest_first():
        keep = read_checkpoint(storage.checkpoint_dir(cid)).referenced_files()
        paths = {e["path"] for h in _handles(ckpt, cid).values() for e in h["chain"]}
        if bad := sorted(p for p in paths if p not in keep or not (ckpt / p).exists()):
            out[cid] = bad
    return out


def _run(cmd: list[str], failpoint: str | None) -> tuple[int, str]:
    env = dict(os.environ)
    env.pop("AIOSTREAM_FAILPOINTS", None)
    if failpoint is not None:
        env["AIOSTREAM_FAILPOINTS"] = failpoint
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_kill9_around_the_first_checkpoint_after_a_restore(tmp_path: Path, workers: int) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    cmd = cli_cmd(
        *generated_pv_args(
            ckpt, out,
            "--set", "app.rate=1000",
            "--set", "checkpoint.interval=50ms",
            "--set", "rest.enabled=false",
            "--set", f"job.workers={workers}",
            events=EVENTS, splits=SPLITS, keys=KEYS, parallelism=2,
        )
    )  # fmt: skip
    storage = CheckpointStorage(ckpt, create=False)

    def latest() -> int:
        chk = storage.latest_valid()
        assert chk is not None
        return chk.checkpoint_id

    code, stderr = _run(cmd, "metadata_durable=kill@3")
    assert code == -signal.SIGKILL, stderr[-3000:]
    restored = latest()
    # between the restore and the first checkpoint; then during its write (delta
    # written, not fsynced): the restored checkpoint stays the newest (a worker
    # killed there is restarted by the main process: only with one process)
    windows = ("restore_after_sinks=kill", "snapshot_write=kill") if workers == 1 else ()
    for window in windows:
        code, stderr = _run(cmd, window)
        assert code == -signal.SIGKILL, (window, stderr[-3000:])
        assert f"restoring from checkpoint {restored} " in stderr, (window, stderr[-3000:])
        if (now := latest()) != restored:  # a first barrier before any input: no file to write
            assert all(h.get("unchanged_since") for h in _handles(ckpt, now).values()), window
            restored = now
        assert _unprotected_files(ckpt) == {}, window
    # right after the first checkpoint's metadata is durable (no sink committed)
    code, stderr = _run(cmd, "metadata_durable=kill")
    assert code == -signal.SIGKILL, stderr[-3000:]
    assert f"restoring from checkpoint {restored} " in stderr, stderr[-3000:]
    first = latest()
    assert first > restored
    before, after = _handles(ckpt, restored), _handles(ckpt, first)
    for s, h in after.items():
        base = before[s]["chain"]
        assert h["kind"] != "full", f"subtask {s}: a full copy of the restored state"
        assert h["chain"][: len(base)] == base, s  # the restored files, referenced
    assert _unprotected_files(ckpt) == {}

    code, stderr = _run(cmd, None)
    assert code == 0, stderr[-3000:]
    assert f"restoring from checkpoint {first} " in stderr, stderr[-3000:]
    assert not list(ckpt.glob("chk-*.bad")), "a checkpoint was set aside"
    assert _unprotected_files(ckpt) == {}
    check = check_pv_output(out, generated_counts(EVENTS, splits=SPLITS, keys=KEYS))
    assert check.exact, (check.duplicates, check.missing, check.gaps[:3])
