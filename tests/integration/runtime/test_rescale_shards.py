"""Rescaling shards through savepoints: 2 shards stopped with a savepoint each, then 1 or 4.

Each shard is stopped by SIGTERM with ``shutdown.mode=savepoint`` (its output
up to the savepoint committed); ``aiostream-ckpt rescale`` merges the
stop-with-savepoints into one restore point; the new shards start from it
on the same ``checkpoint.dir``. The committed output of every layout
together counts every key exactly ``1..n``. A partial set, or a shard that
ran on after its savepoint, is refused naming the key groups, before
anything is written.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt.connectors.key_grouped import write_key_grouped
from aiostream_ckpt.keygroups import Shard
from apps.pv_count import app_id
from tests.helpers import REPO, DaemonProcess, check_pv_output, cli, cli_cmd, recount

pytestmark = pytest.mark.integration

EVENTS = 60_000


def _input(tmp_path: Path) -> list[Path]:
    records = ({"app_id": f"app-{(i * 7919) % 400}", "seq": i} for i in range(EVENTS))
    return write_key_grouped(records, app_id, tmp_path / "in", parts=4)


def _args(tmp_path: Path, files: list[Path], shard: str, *extra: str, rate: int) -> list[str]:
    sets = {
        "app.input": ",".join(map(str, files)),
        "app.output": str(tmp_path / "out"),
        "app.key_grouped": "1",
        "app.rate": str(rate),
        "checkpoint.dir": str(tmp_path / "ckpt"),
        "checkpoint.interval": "100ms",
        "job.batch_size": "256",
        "rest.enabled": "false",
        "restart.strategy": "none",
        "shutdown.mode": "savepoint",
    }
    flags = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return ["run", "apps.pv_count", "--shard", shard, *flags, *extra]


def _stop_both_with_savepoints(tmp_path: Path, files: list[Path]) -> list[str]:
    """Run shards 0/2 and 1/2 until each completed 3 checkpoints, then SIGTERM: savepoints."""
    savepoints = []
    with (
        DaemonProcess(*_args(tmp_path, files, "0/2", rate=3000)) as a,
        DaemonProcess(*_args(tmp_path, files, "1/2", rate=3000)) as b,
    ):
        for d in (a, b):
            d.wait_for("checkpoint 3 completed")
        for d in (a, b):
            d.proc.send_signal(signal.SIGTERM)
        for d in (a, b):
            assert d.wait(120) == 0, d.stderr[-3000:]
            summary: dict[str, Any] = d.summary()
            assert summary["status"] == "stopped_with_savepoint" and "savepoint" in summary, summary
            savepoints.append(summary["savepoint"])
    return savepoints


def _rescale(*args: str) -> subprocess.CompletedProcess[str]:
    return cli("rescale", *args)


@pytest.mark.parametrize("to", [1, 4])
def test_two_shards_rescaled_through_savepoints_count_every_key_once(
    tmp_path: Path, to: int
) -> None:
    files = _input(tmp_path)
    savepoints = _stop_both_with_savepoints(tmp_path, files)
    done = _rescale("--checkpoint-dir", str(tmp_path / "ckpt"), "--shards", str(to))
    assert done.returncode == 0, done.stderr[-3000:]
    plan = orjson.loads(done.stdout.strip().splitlines()[-1])
    assert plan["from_shards"] == 2 and plan["to_shards"] == to
    assert sorted(plan["savepoints"]) == sorted(savepoints)
    point = plan["restore_point"]
    assert f"--shard J/{to} --from-savepoint {point}" in done.stderr
    procs = [
        subprocess.Popen(
            cli_cmd(*_args(tmp_path, files, f"{j}/{to}", "--from-savepoint", point, rate=100_000)),
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            cwd=REPO,
        )
        for j in range(to)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        assert "restoring from savepoint" in err and point in err, err[-3000:]
    check = check_pv_output(tmp_path / "out", recount(*files))
    assert check.exact and check.records == EVENTS, (check.duplicates, check.gaps[:3])
    # the old layout's output stays; the new one's follows in its own directories
    for i in range(2):
        assert list((tmp_path / "out" / Shard(i, 2).dirname).glob("part-*"))
    for j in range(to):
        new = tmp_path / "out" / Shard(j, to).dirname if to > 1 else tmp_path / "out"
        assert list(new.glob("part-*")), new


def test_a_partial_set_of_savepoints_is_refused_naming_the_key_groups(tmp_path: Path) -> None:
    files = _input(tmp_path)
    savepoints = _stop_both_with_savepoints(tmp_path, files)
    first = [s for s in savepoints if "shard-0-of-2" in s]
    partial = _rescale("--from", first[0], "--shards", "3", "--out", str(tmp_path / "p"))
    assert partial.returncode == 2, partial.stderr[-3000:]
    last = partial.stderr.strip().splitlines()[-1]
    assert "the savepoints are of 1 of the 2 shards of job 'pv_count'" in last, last
    assert "missing shard 1/2: key groups 64-127 of 128" in last, last
    assert not (tmp_path / "p").exists()
    twice = _rescale("--from", f"{first[0]},{first[0]}", "--shards", "3")
    assert twice.returncode == 2 and "shard 0/2 is given twice" in twice.stderr, twice.stderr
    # shard 1 runs on from its savepoint (a restart): its savepoint no longer ends its output
    again = subprocess.run(
        cli_cmd(*_args(tmp_path, files, "1/2", rate=100_000)),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    ran_on = _rescale("--checkpoint-dir", str(tmp_path / "ckpt"), "--shards", "4")
    assert ran_on.returncode == 2, ran_on.stderr[-3000:]
    last = ran_on.stderr.strip().splitlines()[-1]
    assert "shard 1/2 (key groups 64-127 of 128) ran on after its stop-with-savepoint" in last
    assert not list((tmp_path / "ckpt").glob("rescale-*"))
