"""Shards on Kafka: one key-grouped topic, two daemons, one exactly-once output topic.

``pv_count`` in Kafka mode with ``app.key_grouped=1`` runs as shard 0/2 and
shard 1/2 side by side: each reads the partition of its key groups, keeps
its own checkpoint chain, and writes the shared output topic through
transactional ids of its own (``<prefix>-<the job's subtask>-<slot>``, the
same for whatever daemon runs that shard next, so it fences a stale one).
Shard 1 is killed with SIGKILL right after a checkpoint and started again;
``read_committed``, the union of both shards' output is exactly the
failure-free result: per key the updates ``1..n`` in order.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt.connectors.generator import write_generated_jsonl
from aiostream_ckpt_dev.demo.kafka import load_jsonl
from aiostream_ckpt_dev.recount import check_pv_updates, recount_inputs
from apps.pv_count import app_id
from tests.helpers import REPO, DaemonProcess, cli_cmd, newest_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

EVENTS = 200_000


def _args(ckpt: Path, bootstrap: str, source: str, output: str, shard: str) -> list[str]:
    sets = {
        "job.name": f"pv-{output}",
        "checkpoint.dir": str(ckpt),
        "checkpoint.interval": "100ms",
        "app.kafka_bootstrap": bootstrap,
        "app.input_topic": source,
        "app.output_topic": output,
        "app.stop_at_end": "1",
        "app.key_grouped": "1",
        "job.batch_size": "512",
        "rest.enabled": "false",
        "restart.strategy": "none",
    }
    flags = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return ["run", "apps.pv_count", "--shard", shard, *flags]


async def test_kill9_of_a_shard_keeps_the_union_of_the_shards_output_exact(
    kafka_broker: Any, new_topic: Any, read_topic: Any, tmp_path: Path
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    source, output = await new_topic(2, prefix="in"), await new_topic(2, prefix="out")
    events = tmp_path / "events.jsonl"
    write_generated_jsonl(events, EVENTS, seed=4, keys=300)
    assert await load_jsonl(bootstrap, source, events, key_grouped=app_id) == EVENTS

    chain1 = tmp_path / "ckpt" / "shard-1-of-2"

    def run() -> tuple[str, str, str, int]:
        kill = {"AIOSTREAM_FAILPOINTS": "metadata_durable=kill@3"}
        args = [_args(tmp_path / "ckpt", bootstrap, source, output, s) for s in ("0/2", "1/2")]
        with DaemonProcess(*args[0]) as shard0, DaemonProcess(*args[1], env=kill) as shard1:
            assert shard1.wait(180) == -9, shard1.stderr[-3000:]
            restored = newest_checkpoint(chain1)
            again = subprocess.run(
                cli_cmd(*args[1]), capture_output=True, text=True, timeout=240, cwd=REPO
            )
            assert again.returncode == 0, again.stderr[-3000:]
            assert shard0.wait(240) == 0, shard0.stderr[-3000:]
            return shard0.stderr, shard1.stderr, again.stderr, restored

    log0, log1, log1_again, restored = await asyncio.to_thread(run)
    assert f"restoring from checkpoint {restored} ({chain1}" in log1_again, log1_again[-3000:]
    assert "restoring" not in log0  # shard 0 never noticed
    # each shard's producers are its own: the job's subtask 0 in shard 0, 1 in shard 1
    base = f"pv-{output}-pv-sink"
    assert re.search(rf"transactional producers {re.escape(base)}-0-0\.\.\d+ ready", log0)
    for log in (log1, log1_again):
        assert re.search(rf"transactional producers {re.escape(base)}-1-0\.\.\d+ ready", log)
    # each shard read only the partition of its key groups
    assert f"reading {source}:0@" in log0 and f"{source}:1" not in log0
    assert f"reading {source}:1@" in log1_again and f"{source}:0@" not in log1_again

    values = await read_topic(output, timeout_s=60)
    expected, malformed = recount_inputs([events])
    verdict = check_pv_updates(map(orjson.loads, values), expected, malformed=malformed)
    assert verdict.passed, verdict.problems[:10]


async def test_a_stale_daemon_of_a_shard_is_fenced_by_its_replacement(
    kafka_broker: Any, new_topic: Any, read_topic: Any, tmp_path: Path
) -> None:
    """SIGSTOP shard 1, start a replacement from a copy of its chain, resume the old one.

    The copy stands for the chain another host reads (object storage): the
    replacement restores it and runs shard 1 to the end; its producers took
    over the shard's transactional ids, so the resumed daemon's next send or
    commit is fenced by the broker (a newer epoch) and it fails without
    committing anything.
    """
    bootstrap = kafka_broker.bootstrap_servers
    source, output = await new_topic(2, prefix="in"), await new_topic(2, prefix="out")
    events = tmp_path / "events.jsonl"
    write_generated_jsonl(events, EVENTS, seed=9, keys=300)
    assert await load_jsonl(bootstrap, source, events, key_grouped=app_id) == EVENTS
    elsewhere = tmp_path / "elsewhere"

    def run() -> tuple[int, str, str]:
        args = [_args(tmp_path / "ckpt", bootstrap, source, output, s) for s in ("0/2", "1/2")]
        with DaemonProcess(*args[0]) as shard0, DaemonProcess(*args[1]) as stale:
            stale.wait_for("checkpoint 3 completed")
            os.kill(stale.proc.pid, signal.SIGSTOP)
            try:
                shutil.copytree(tmp_path / "ckpt" / "shard-1-of-2", elsewhere / "shard-1-of-2")
                replacement = _args(elsewhere, bootstrap, source, output, "1/2")
                took_over = subprocess.run(
                    cli_cmd(*replacement), capture_output=True, text=True, timeout=240, cwd=REPO
                )
                assert took_over.returncode == 0, took_over.stderr[-3000:]
            finally:
                os.kill(stale.proc.pid, signal.SIGCONT)
            code = stale.wait(120)
            assert shard0.wait(240) == 0, shard0.stderr[-3000:]
            return code, stale.stderr, took_over.stderr

    code, stale_log, took_over = await asyncio.to_thread(run)
    assert "restoring from checkpoint" in took_over, took_over[-3000:]
    assert code == 1, stale_log[-3000:]  # restart.strategy=none: it fails, it does not commit
    assert re.search(r"[Ff]enced|ProducerFenced|InvalidProducerEpoch", stale_log), stale_log[-3000:]
    values = await read_topic(output, timeout_s=60)
    expected, malformed = recount_inputs([events])
    verdict = check_pv_updates(map(orjson.loads, values), expected, malformed=malformed)
    assert verdict.passed, verdict.problems[:10]


async def test_two_shards_rescaled_to_four_through_savepoints_stay_exact(
    kafka_broker: Any, new_topic: Any, read_topic: Any, tmp_path: Path
) -> None:
    """Stop both shards with a savepoint, ``rescale`` to 4, run 4 daemons to the end.

    Each new shard restores the key groups of its partition from the old
    shard that held them, its partition's offset from the merged positions,
    and commits or fences what the old shards' transactions left.
    """
    bootstrap = kafka_broker.bootstrap_servers
    source, output = await new_topic(4, prefix="in"), await new_topic(2, prefix="out")
    events = tmp_path / "events.jsonl"
    write_generated_jsonl(events, EVENTS, seed=12, keys=300)
    assert await load_jsonl(bootstrap, source, events, key_grouped=app_id) == EVENTS
    ckpt = tmp_path / "ckpt"

    def run() -> list[str]:
        args = [
            [*_args(ckpt, bootstrap, source, output, s), "--set", "shutdown.mode=savepoint"]
            for s in ("0/2", "1/2")
        ]
        with DaemonProcess(*args[0]) as a, DaemonProcess(*args[1]) as b:
            for d in (a, b):
                d.wait_for("checkpoint 3 completed")
            for d in (a, b):
                d.proc.send_signal(signal.SIGTERM)
            for d in (a, b):
                assert d.wait(120) == 0, d.stderr[-3000:]
                assert "savepoint" in d.summary(), d.stderr[-3000:]
        plan = subprocess.run(
            cli_cmd("rescale", "--checkpoint-dir", str(ckpt), "--shards", "4"),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert plan.returncode == 0, plan.stderr[-3000:]
        point = orjson.loads(plan.stdout.strip().splitlines()[-1])["restore_point"]
        procs = [
            subprocess.Popen(
                cli_cmd(
                    *_args(ckpt, bootstrap, source, output, f"{j}/4"), "--from-savepoint", point
                ),
                stderr=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                text=True,
                cwd=REPO,
            )
            for j in range(4)
        ]
        logs = []
        for proc in procs:
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            logs.append(err)
        return logs

    logs = await asyncio.to_thread(run)
    base = re.escape(f"pv-{output}-pv-sink")
    for j, log in enumerate(logs):
        assert "restoring from savepoint" in log, log[-3000:]
        assert re.search(rf"transactional producers {base}-{j}-0\.\.\d+ ready", log), log[-3000:]
        assert f"reading {source}:{j}@" in log, log[-3000:]
    values = await read_topic(output, timeout_s=60)
    expected, malformed = recount_inputs([events])
    verdict = check_pv_updates(map(orjson.loads, values), expected, malformed=malformed)
    assert verdict.passed, verdict.problems[:10]
