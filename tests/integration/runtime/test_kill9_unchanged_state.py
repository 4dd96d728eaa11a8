"""kill -9, then restore and rescale from checkpoints whose keyed state is a reference.

A keyed instance whose state did not change since its last completed
checkpoint writes no file: its handle names that checkpoint's chain
(``unchanged_since``). Paced input (12 events/s, 20 ms checkpoints) makes most
checkpoints such references; each run is killed right after one completes,
then restored from it at another parallelism (2 → 3 → 1: key groups split and
merged). If a reference were broken (a file retention deleted, a chain not
the base's) the restore would fail or fall back to an older checkpoint: the
test requires each restart to restore the reference checkpoint itself, none
set aside, and the output to be exact.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from aiostream_ckpt.checkpoint.storage import CheckpointStorage, read_checkpoint
from aiostream_ckpt.connectors.staging import read_committed_output
from tests.helpers import REPO, check_pv_output, cli_cmd, generated_counts, generated_pv_args

pytestmark = pytest.mark.integration

EVENTS, KEYS = 60, 8
_COMPLETED = re.compile(rb"checkpoint (\d+) completed")


def _references(ckpt: Path, cid: int) -> bool:
    """Whether every keyed handle of checkpoint ``cid`` references an older checkpoint's chain."""
    chk = read_checkpoint(CheckpointStorage(ckpt, create=False).checkpoint_dir(cid))
    handles = [st["keyed"] for st in chk.operators["pv-count"]["subtasks"].values()]
    return bool(handles) and all(h.get("unchanged_since") for h in handles)


def _unprotected_files(ckpt: Path) -> dict[int, list[str]]:
    """Chain files of completed checkpoints that are missing or that retention would not keep."""
    storage = CheckpointStorage(ckpt, create=False)
    out: dict[int, list[str]] = {}
    for cid in storage.completed_newest_first():
        chk = read_checkpoint(storage.checkpoint_dir(cid))
        keep = chk.referenced_files()
        chains = [st["keyed"]["chain"] for st in chk.operators["pv-count"]["subtasks"].values()]
        paths = {e["path"] for chain in chains for e in chain}
        if bad := sorted(p for p in paths if p not in keep or not (ckpt / p).exists()):
            out[cid] = bad
    return out


def _kill_after_a_reference(cmd: list[str], ckpt: Path, out: Path) -> tuple[int, bool, str]:
    """Run ``cmd``; SIGKILL it right after a reference checkpoint completes.

    Returns the newest valid checkpoint after the kill, whether it is a
    reference (not when a newer one completed before the kill landed: rare,
    the caller runs again), and the run's stderr.
    """
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=REPO)
    assert proc.stderr is not None
    lines: list[bytes] = []
    try:
        for raw in proc.stderr:
            lines.append(raw)
            m = _COMPLETED.search(raw)
            if m and any(True for _ in read_committed_output(out)) and _references(ckpt, int(m[1])):
                os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    stderr = b"".join(lines).decode(errors="replace")
    assert proc.returncode == -signal.SIGKILL, "the job ended first:\n" + stderr[-3000:]
    assert _unprotected_files(ckpt) == {}
    latest = CheckpointStorage(ckpt, create=False).latest_valid()
    assert latest is not None
    return latest.checkpoint_id, _references(ckpt, latest.checkpoint_id), stderr


def test_kill9_restore_and_rescale_from_unchanged_state(tmp_path: Path) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"

    def cmd(parallelism: int) -> list[str]:
        args = generated_pv_args(
            ckpt, out,
            "--set", "app.rate=12",
            "--set", "checkpoint.interval=20ms",
            "--set", "rest.enabled=false",
            events=EVENTS, splits=1, keys=KEYS, parallelism=parallelism,
        )  # fmt: skip
        return cli_cmd(*args)

    last: int | None = None  # the checkpoint the next run must restore
    references: list[int] = []
    for parallelism in (2, 3):  # each kill's restore point is the next run's, rescaled
        for _ in range(5):
            cid, reference, stderr = _kill_after_a_reference(cmd(parallelism), ckpt, out)
            if last is not None:
                assert f"restoring from checkpoint {last} " in stderr, stderr[-3000:]
            last = cid
            if reference:
                references.append(cid)
                break
        else:
            pytest.fail("never killed right after a reference checkpoint")
    final = subprocess.run(cmd(1), capture_output=True, text=True, cwd=REPO, timeout=120)
    assert final.returncode == 0, final.stderr[-3000:]
    assert f"restoring from checkpoint {references[-1]} " in final.stderr
    assert not list(ckpt.glob("chk-*.bad")), "a checkpoint was set aside"
    check = check_pv_output(out, generated_counts(EVENTS, splits=1, keys=KEYS))
    assert check.exact, (check.duplicates, check.missing, check.gaps[:3])
