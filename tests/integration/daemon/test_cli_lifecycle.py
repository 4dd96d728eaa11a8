"""The CLI around a job: SIGTERM/SIGINT stop cleanly and resume, checkpoints list/inspect."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.helpers import (
    REPO,
    check_pv_output,
    cli,
    cli_cmd,
    generated_pv_args,
    make_pv_input,
    recount,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly_and_run_resumes(tmp_path: Path, sig: signal.Signals) -> None:
    inp = make_pv_input(tmp_path / "in.jsonl", 600_000)
    args = [
        "run",
        "apps.pv_count",
        "--set",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "--set",
        f"app.input={inp}",
        "--set",
        f"app.output={tmp_path / 'out'}",
        "--set",
        "checkpoint.interval=30ms",
        "--set",
        "job.batch_size=256",
    ]
    proc = subprocess.Popen(cli_cmd(*args), stderr=subprocess.PIPE, cwd=REPO)
    assert proc.stderr is not None
    for raw in proc.stderr:
        if b"checkpoint 2 completed" in raw:
            proc.send_signal(sig)
            break
    rest = proc.stderr.read().decode()
    assert proc.wait(timeout=30) == 0, rest
    assert '"status":"canceled"' in rest
    r = cli(*args)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "restoring from checkpoint" in r.stderr
    assert check_pv_output(tmp_path / "out", recount(inp)).exact


def test_checkpoints_list_and_inspect(tmp_path: Path) -> None:
    inp = make_pv_input(tmp_path / "in.jsonl", 20_000, keys=50)
    ckpt = tmp_path / "ckpt"
    r = cli(
        "run",
        "apps.pv_count",
        "--set",
        f"checkpoint.dir={ckpt}",
        "--set",
        f"app.input={inp}",
        "--set",
        f"app.output={tmp_path / 'out'}",
    )
    assert r.returncode == 0, r.stderr
    listing = cli("checkpoints", "list", str(ckpt))
    assert listing.returncode == 0
    rows = listing.stdout.strip().splitlines()
    assert rows[0].split()[:2] == ["id", "completed"]
    assert "completed (final)" in rows[1]
    info = json.loads(cli("checkpoints", "inspect", str(ckpt)).stdout)
    assert info["final"] is True
    assert set(info["operator_state_bytes"]) == {"events", "pv-count", "pv-sink"}
    assert info["operator_state_bytes"]["pv-count"] > 0
    (position,) = info["source_positions"].values()
    assert position == inp.stat().st_size
    assert info["duration_ms"] >= 0 and info["size_bytes"] > 0


def test_checkpoints_inspect_of_a_missing_id_says_so(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    r = cli(*generated_pv_args(ckpt, tmp_path / "out", "--set", "rest.enabled=false", events=2000))
    assert r.returncode == 0, r.stderr
    (cid,) = [
        line.split()[0] for line in cli("checkpoints", "list", str(ckpt)).stdout.splitlines()[1:]
    ]
    r = cli("checkpoints", "inspect", str(ckpt), "12345")
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"aiostream-ckpt: error: checkpoint 12345 does not exist in {ckpt} (completed: {cid})"
    )


def test_inspect_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    """``inspect DIR | head``: the reader leaving early is no error (was a BrokenPipeError)."""
    ckpt = tmp_path / "ckpt"
    r = cli(*generated_pv_args(ckpt, tmp_path / "out", "--set", "rest.enabled=false", events=2000))
    assert r.returncode == 0, r.stderr
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `head` having exited: every write gets EPIPE
    try:
        p = subprocess.run(
            cli_cmd("checkpoints", "inspect", str(ckpt)),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert p.returncode == 0
    assert p.stderr == ""


def test_app_run_by_file_path_is_named_after_its_module(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    run = generated_pv_args(ckpt, tmp_path / "out", "--set", "rest.enabled=false", events=2000)
    assert run[:2] == ["run", "apps.pv_count"]
    r = cli("run", "apps/pv_count.py", *run[2:])
    assert r.returncode == 0, r.stderr
    info = json.loads(cli("checkpoints", "inspect", str(ckpt)).stdout)
    assert info["job"] == "pv_count"


def test_checkpoint_dir_of_another_app_gets_the_right_advice(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b'{"key": "a", "value": 1}\n')
    ckpt = tmp_path / "ckpt"
    r = cli(
        "run",
        "apps.running_sum",
        "--set",
        f"checkpoint.dir={ckpt}",
        "--set",
        f"app.input={inp}",
        "--set",
        f"app.output={tmp_path / 'sums'}",
        "--set",
        "rest.enabled=false",
    )
    assert r.returncode == 0, r.stderr
    r = cli(*generated_pv_args(ckpt, tmp_path / "out", "--set", "rest.enabled=false", events=2000))
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert f"checkpoint.dir {ckpt} holds checkpoints of job 'running_sum'" in last, last
    assert "not of job 'pv_count'" in last and "its own checkpoint.dir" in last
    assert "--allow-non-restored-state" not in last
    assert not (tmp_path / "out").exists()


def test_checkpoints_list_flags_corruption(tmp_path: Path) -> None:
    (tmp_path / "chk-0000000001").mkdir()
    (tmp_path / "chk-0000000001" / "_metadata").write_bytes(b"{}\nsha256:00\n")
    r = cli("checkpoints", "list", str(tmp_path))
    assert "CORRUPT" in r.stdout and "checksum mismatch" in r.stdout


def test_running_sum_app(tmp_path: Path) -> None:
    events = [
        {"key": k, "value": v}
        for k, v in [("a", 1), ("b", 2), ("a", 3), ("c", 5), ("b", 4), ("a", 10)]
    ]
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    r = cli(
        "run",
        "apps.running_sum",
        "--set",
        f"checkpoint.dir={tmp_path / 'c'}",
        "--set",
        f"app.input={inp}",
        "--set",
        f"app.output={tmp_path / 'out'}",
    )
    assert r.returncode == 0, r.stderr
    from aiostream_ckpt.connectors.staging import read_committed_output

    out = list(read_committed_output(tmp_path / "out"))
    assert out == [
        {"key": "a", "sum": 1},
        {"key": "b", "sum": 2},
        {"key": "a", "sum": 4},
        {"key": "c", "sum": 5},
        {"key": "b", "sum": 6},
        {"key": "a", "sum": 14},
    ]
