"""Savepoints through the daemon: stop-with-savepoint, restore rescaled, trigger while running.

The job is pv_count on paced generated input (so it is surely still running
when the savepoint is asked for); the restored runs drop the pacing, which
changes no event. Output must be exactly that of a failure-free run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from aiostream_ckpt.checkpoint.storage import read_checkpoint
from tests.helpers import DaemonProcess, check_pv_output, cli, generated_counts, generated_pv_args

pytestmark = pytest.mark.integration

TOKEN = "integration-token"
EVENTS, SPLITS, KEYS = 60_000, 2, 300


def pv_args(ckpt: Path, out: Path, parallelism: int, *extra: str) -> list[str]:
    return generated_pv_args(
        ckpt, out, "--set", "job.batch_size=256", *extra,
        events=EVENTS, splits=SPLITS, keys=KEYS, parallelism=parallelism,
    )  # fmt: skip


def live(ckpt: Path, out: Path, parallelism: int, *extra: str) -> DaemonProcess:
    """A paced run (about 6 s of input) with the REST API on a free port."""
    args = pv_args(ckpt, out, parallelism, "--set", "app.rate=5000", "--set", "rest.port=0")
    return DaemonProcess(*args, *extra, env={"AIOSTREAM_REST__TOKEN": TOKEN})


def stop_with_savepoint(tmp_path: Path, parallelism: int) -> tuple[Path, int]:
    with live(tmp_path / "ckpt", tmp_path / "out", parallelism) as d:
        d.wait_for("checkpoint 3 completed")
        status, sp = d.request("POST", "/job/stop-with-savepoint", token=TOKEN)
        assert status == 200, sp
        assert d.wait() == 0, d.stderr[-3000:]
        summary = d.summary()
        assert summary["status"] == "stopped_with_savepoint" and summary["savepoint"] == sp["path"]
        assert f"savepoint {sp['id']} stored at {sp['path']}" in d.stderr
    return Path(sp["path"]), int(sp["id"])


def test_stop_with_savepoint_restore_at_1_and_3(tmp_path: Path) -> None:
    savepoint, sp_id = stop_with_savepoint(tmp_path, 2)
    chk = read_checkpoint(savepoint)
    assert chk.is_savepoint and chk.operators["pv-sink"]["parallelism"] == 2
    positions = {
        k: v
        for st in chk.subtask_states("events").values()
        for k, v in st["operator"]["positions"].items()
    }
    assert 0 < sum(positions.values()) < EVENTS, "the savepoint was taken mid-run"
    expected = generated_counts(EVENTS, splits=SPLITS, keys=KEYS)
    for new_p in (1, 3):
        out = tmp_path / f"out-p{new_p}"
        shutil.copytree(tmp_path / "out", out)  # staged files included: the savepoint lists them
        r = cli(
            *pv_args(tmp_path / f"ckpt-p{new_p}", out, new_p, "--set", "rest.enabled=false"),
            "--from-savepoint",
            str(savepoint),
        )
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"restoring from savepoint {sp_id}" in r.stderr
        check = check_pv_output(out, expected)
        assert check.exact, (new_p, check.duplicates, check.missing, check.gaps[:3])
        assert check.records == EVENTS
        # checkpoint ids go on after the savepoint's, so no output file name is reused
        assert (
            read_checkpoint(next((tmp_path / f"ckpt-p{new_p}").glob("chk-*"))).checkpoint_id > sp_id
        )


def test_restore_in_the_same_checkpoint_dir_prefers_its_checkpoints(tmp_path: Path) -> None:
    """Flink HA's rule: the directory's own newer restore point wins over --from-savepoint.

    After stop-with-savepoint that is the stop's savepoint (its output is
    committed, so the directory records it), not an older savepoint named on
    the command line; still exact, nothing retracted.
    """
    with live(tmp_path / "ckpt", tmp_path / "out", 2) as d:
        d.wait_for("checkpoint 2 completed")
        status, older = d.request("POST", "/savepoints", token=TOKEN)
        assert status == 200, older
        d.wait_for(f"checkpoint {older['id'] + 1} completed")
        status, stop = d.request("POST", "/job/stop-with-savepoint", token=TOKEN)
        assert status == 200, stop
        assert d.wait() == 0, d.stderr[-3000:]
    r = cli(
        *pv_args(tmp_path / "ckpt", tmp_path / "out", 2, "--set", "rest.enabled=false"),
        "--from-savepoint",
        older["path"],
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"restoring from savepoint {stop['id']}" in r.stderr
    assert not (tmp_path / "out" / "_retracted").exists()
    assert check_pv_output(
        tmp_path / "out", generated_counts(EVENTS, splits=SPLITS, keys=KEYS)
    ).exact


def test_cli_savepoint_trigger_while_running(tmp_path: Path) -> None:
    with live(tmp_path / "ckpt", tmp_path / "out", 2) as d:
        d.wait_for("checkpoint 2 completed")
        url = d.url
        refused = cli("savepoint", "trigger", "--url", url, env={"AIOSTREAM_REST__TOKEN": ""})
        assert refused.returncode == 1 and "(401)" in refused.stderr
        r = cli(
            "savepoint",
            "trigger",
            "--url",
            url,
            "--dir",
            str(tmp_path / "sps"),
            env={"AIOSTREAM_REST__TOKEN": TOKEN},
        )
        assert r.returncode == 0, r.stderr
        sp = orjson.loads(r.stdout)
        assert Path(sp["path"]).parent == tmp_path / "sps"
        assert read_checkpoint(Path(sp["path"])).is_savepoint
        assert d.wait(timeout=120) == 0, d.stderr[-3000:]
        assert d.summary()["status"] == "finished"
    # retention never touched it, and the job's own output is exact
    assert (Path(sp["path"]) / "_metadata").exists()
    assert check_pv_output(
        tmp_path / "out", generated_counts(EVENTS, splits=SPLITS, keys=KEYS)
    ).exact


def test_cli_savepoint_stop_with_token_flag(tmp_path: Path) -> None:
    with live(tmp_path / "ckpt", tmp_path / "out", 1) as d:
        d.wait_for("checkpoint 2 completed")
        r = cli(
            "savepoint", "stop", "--url", d.url, "--token", TOKEN, env={"AIOSTREAM_REST__TOKEN": ""}
        )
        assert r.returncode == 0, r.stderr
        assert d.wait() == 0
    unreachable = cli("savepoint", "trigger", "--url", d.url, "--token", TOKEN)
    assert unreachable.returncode == 2 and "cannot reach the daemon" in unreachable.stderr


def test_cli_savepoint_dispose(tmp_path: Path) -> None:
    env = {"AIOSTREAM_REST__TOKEN": TOKEN}
    # paced slower: both savepoints come before the end of the input on a loaded machine
    with live(tmp_path / "ckpt", tmp_path / "out", 2, "--set", "app.rate=2000") as d:
        d.wait_for("checkpoint 2 completed")
        triggered = [cli("savepoint", "trigger", "--url", d.url, env=env) for _ in range(2)]
        assert all(r.returncode == 0 for r in triggered), [r.stderr for r in triggered]
        taken = [orjson.loads(r.stdout) for r in triggered]
        refused = cli("savepoint", "dispose", str(taken[0]["id"]), "--url", d.url,
                      env={"AIOSTREAM_REST__TOKEN": ""})  # fmt: skip
        assert refused.returncode == 1 and "(401)" in refused.stderr
        by_id = cli("savepoint", "dispose", str(taken[0]["id"]), "--url", d.url, env=env)
        assert by_id.returncode == 0, by_id.stderr
        assert orjson.loads(by_id.stdout)["path"] == taken[0]["path"]
        by_path = cli("savepoint", "dispose", taken[1]["path"], "--url", d.url, env=env)
        assert by_path.returncode == 0, by_path.stderr
        again = cli("savepoint", "dispose", taken[1]["path"], "--url", d.url, env=env)
        assert again.returncode == 1 and "(404)" in again.stderr
        assert "no such savepoint directory" in again.stderr
        assert d.wait(timeout=120) == 0, d.stderr[-3000:]
    assert not any(Path(sp["path"]).exists() for sp in taken)
    assert check_pv_output(
        tmp_path / "out", generated_counts(EVENTS, splits=SPLITS, keys=KEYS)
    ).exact
