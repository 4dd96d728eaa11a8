"""Shards as separate daemons: kill -9 one, restart it; the others never notice.

Two ``aiostream-ckpt run apps.pv_count --shard I/2`` daemons read one
key-grouped input (four files, two per shard) side by side, each with its
own checkpoint chain under ``checkpoint.dir``; shard 0 is killed with
SIGKILL right after a checkpoint and started again. The union of the
shards' committed files counts every key exactly ``1..n``. A second
daemon given a running shard, a shard that does not exist, and a fresh
layout beside another one are refused before they write anything.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from aiostream_ckpt.connectors.key_grouped import write_key_grouped
from apps.pv_count import app_id
from tests.helpers import DaemonProcess, check_pv_output, cli, cli_cmd, newest_checkpoint, recount

pytestmark = pytest.mark.integration

EVENTS = 80_000


def _input(tmp_path: Path) -> list[Path]:
    records = ({"app_id": f"app-{(i * 7919) % 500}", "seq": i} for i in range(EVENTS))
    return write_key_grouped(records, app_id, tmp_path / "in", parts=4)


def _args(
    tmp_path: Path, files: list[Path], shard: str, *extra: str, rate: int = 8000
) -> list[str]:
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
    }
    flags = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return ["run", "apps.pv_count", "--shard", shard, *flags, *extra]


def test_kill9_of_one_shard_is_recovered_by_restarting_it_alone(tmp_path: Path) -> None:
    files = _input(tmp_path)
    kill = {"AIOSTREAM_FAILPOINTS": "metadata_durable=kill@3"}
    with (
        DaemonProcess(*_args(tmp_path, files, "0/2"), env=kill) as shard0,
        DaemonProcess(*_args(tmp_path, files, "1/2")) as shard1,
    ):
        assert shard0.wait(120) == -9, shard0.stderr[-3000:]
        chain0 = tmp_path / "ckpt" / "shard-0-of-2"
        restored = newest_checkpoint(chain0)
        assert shard1.proc.poll() is None  # shard 1 runs on, untouched
        again = subprocess.run(
            cli_cmd(*_args(tmp_path, files, "0/2")), capture_output=True, text=True, timeout=180
        )
        assert again.returncode == 0, again.stderr[-3000:]
        assert f"restoring from checkpoint {restored} ({chain0}" in again.stderr
        assert shard1.wait(180) == 0, shard1.stderr[-3000:]
        assert "restoring" not in shard1.stderr
    check = check_pv_output(tmp_path / "out", recount(*files))
    assert check.exact and check.records == EVENTS, check.gaps[:3]
    for i in (0, 1):  # each shard's output in its own directory, none beside them
        assert list((tmp_path / "out" / f"shard-{i}-of-2").glob("part-*"))
    assert not list((tmp_path / "out").glob("part-*"))


def test_bad_shards_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    files = _input(tmp_path)
    with DaemonProcess(*_args(tmp_path, files, "1/2", rate=500)) as running:
        running.wait_for("checkpoint 1 completed")
        # the same shard again, on the same checkpoint.dir: its chain has one owner
        twice = cli(*_args(tmp_path, files, "1/2"))
        assert twice.returncode == 2, twice.stderr[-3000:]
        last = twice.stderr.strip().splitlines()[-1]
        chain = tmp_path / "ckpt" / "shard-1-of-2"
        assert f"the checkpoint directory {chain} is in use by job 'pv_count' (pid " in last, last
        assert f"pid {running.proc.pid} " in last, last
        # another shard of the same layout runs beside it
        other = cli(*_args(tmp_path, files, "0/2", rate=100_000), timeout=180)
        assert other.returncode == 0, other.stderr[-3000:]
        # a fresh layout of 3 shards beside the 2-shard one would read the input again
        fresh = cli(*_args(tmp_path, files, "0/3"))
        assert fresh.returncode == 2, fresh.stderr[-3000:]
        last = fresh.stderr.strip().splitlines()[-1]
        assert "holds checkpoints of this job run in another layout (2 shards: " in last, last
        assert "shard 0/3 has none of its own" in last and "rescale" in last, last
        assert not (tmp_path / "out" / "shard-0-of-3").exists()
        assert running.proc.poll() is None
        running.proc.kill()
    for shard, why in (
        ("2/2", "invalid config job.shard='2/2' (from --set): must be I/N with I in 0..N-1"),
        ("0/129", "must be at most job.max_parallelism (128) shards"),
        ("0/8", "4 split(s) (partitions or files) for 8 shards: more shards than the input"),
        ("1/3", "holds key groups 32-63, which shards 0-1 of 3 share"),
    ):
        bad = cli(*_args(tmp_path / shard.replace("/", "-"), files, shard))
        assert bad.returncode in (1, 2), bad.stderr[-3000:]
        assert why in bad.stderr.strip().splitlines()[-1], bad.stderr[-2000:]
        assert not list((tmp_path / shard.replace("/", "-")).rglob("part-*"))
