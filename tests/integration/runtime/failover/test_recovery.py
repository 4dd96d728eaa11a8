"""Recovery: failover inside the process, corrupt checkpoints, fail-fast, exhaustion."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO, check_pv_output, cli, cli_cmd, make_pv_input, recount

pytestmark = pytest.mark.integration


def pv_args(tmp_path: Path, inp: Path, *extra: str) -> list[str]:
    return [
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
        *extra,
    ]


def test_task_failure_restarts_from_checkpoint(tmp_path: Path) -> None:
    inp = make_pv_input(tmp_path / "in.jsonl", 200_000)
    r = cli(
        "run",
        "tests.apps.flaky_count",
        *pv_args(
            tmp_path,
            inp,
            "--set",
            "app.fail_at=150000",
            "--set",
            f"app.marker={tmp_path / 'm'}",
            "--set",
            "restart.delay=10ms",
        ),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "injected failure at seq 150000" in r.stderr
    assert '"restarts":1' in r.stderr
    assert check_pv_output(tmp_path / "out", recount(inp)).exact


@pytest.mark.parametrize("strategy", ["fixed_delay", "exponential_delay", "failure_rate"])
def test_restart_strategy_exhausts_and_reports_cause(tmp_path: Path, strategy: str) -> None:
    inp = make_pv_input(tmp_path / "in.jsonl", 5_000)
    r = cli(
        "run",
        "tests.apps.flaky_count",
        *pv_args(
            tmp_path,
            inp,
            "--set",
            "app.fail_at=100",
            "--set",
            f"app.marker={tmp_path / 'm'}",
            "--set",
            "app.always_fail=1",
            "--set",
            f"restart.strategy={strategy}",
            "--set",
            "restart.attempts=2",
            "--set",
            "restart.delay=10ms",
        ),
    )
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert f"job 'flaky_count' failed after 2 restarts (restart.strategy={strategy} " in last, last
    assert "RuntimeError: injected failure at seq 100" in last


def run_until_checkpoint(cmd: list[str], n: int) -> None:
    """Start the worker, SIGKILL it right after checkpoint ``n`` completes."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=REPO)
    assert proc.stderr is not None
    for raw in proc.stderr:
        if f"checkpoint {n} completed".encode() in raw:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "job ended before the checkpoint"


@pytest.mark.parametrize("damage", ["metadata", "state-file"])
def test_corrupt_latest_checkpoint_falls_back(tmp_path: Path, damage: str) -> None:
    inp = make_pv_input(tmp_path / "in.jsonl", 400_000)
    args = pv_args(tmp_path, inp, "--set", "checkpoint.retained=3")
    run_until_checkpoint(cli_cmd("run", "apps.pv_count", *args), 4)
    chks = sorted((tmp_path / "ckpt").glob("chk-*"))
    latest = [c for c in chks if (c / "_metadata").exists()][-1]
    if damage == "metadata":
        meta = latest / "_metadata"
        data = bytearray(meta.read_bytes())
        data[10] ^= 0xFF
        meta.write_bytes(bytes(data))
    else:
        import orjson

        body = (latest / "_metadata").read_bytes().rsplit(b"\n", 2)[0]
        handle = orjson.loads(body)["operators"]["pv-count"]["subtasks"]["0"]["keyed"]
        victim = tmp_path / "ckpt" / handle["files"][-1]
        victim.write_bytes(victim.read_bytes()[:-7] + b"garbage")
    r = cli("run", "apps.pv_count", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    cid = int(latest.name.split("-")[1])
    assert f"checkpoint {cid}" in r.stderr and "falling back to the previous one" in r.stderr
    assert check_pv_output(tmp_path / "out", recount(inp)).exact


def test_malformed_input_fail_fast(tmp_path: Path) -> None:
    inp = make_pv_input(tmp_path / "in.jsonl", 1_000, malformed=1)
    r = cli(
        "run",
        "apps.pv_count",
        *pv_args(
            tmp_path,
            inp,
            "--set",
            "errors.on_malformed=fail",
            "--set",
            "restart.strategy=none",
        ),
    )
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert "RecordError" in last and "malformed record" in last and "'offset'" in last, last
    assert not list((tmp_path / "out").glob("part-*")), "nothing committed"


def test_malformed_input_dead_lettered_once(tmp_path: Path) -> None:
    inp = make_pv_input(tmp_path / "in.jsonl", 50_000, malformed=3)
    with open(inp, "ab") as f:  # valid JSON, but not a page view: no string app_id
        f.write(b'{"user_id": "u-1"}\n{"app_id": 17}\n')
    r = cli("run", "apps.pv_count", *pv_args(tmp_path, inp))
    assert r.returncode == 0, r.stderr[-2000:]
    from aiostream_ckpt.connectors.staging import read_committed_output

    dead = list(
        read_committed_output(tmp_path / "ckpt" / "dead-letter" / "events", prefix="dead-letter")
    )
    assert len(dead) == 5
    assert all(d["origin"]["file"].endswith("in.jsonl") and "reason" in d for d in dead)
    assert sum("field 'app_id' must be str" in d["reason"] for d in dead) == 2
    assert check_pv_output(tmp_path / "out", recount(inp)).exact
