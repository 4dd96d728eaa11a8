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
