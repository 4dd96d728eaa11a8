"""Two daemons on one prefix: the stale one, resumed, commits nothing.

Daemon A runs pv_count with checkpoints in SeaweedFS and is SIGSTOPped (a
long GC, a partition). Daemon B starts on the same prefix from an empty local
disk: it claims the prefix (fencing A), restores A's newest checkpoint and
runs to the end. A is then resumed and must stop without committing:

- output in the store (files -> ``s3://``): nothing but the chain's ETag
  stops A -- its next completion is a conditional write that loses, so it
  stops with FencedError and never completes its pre-committed uploads;
- Kafka -> Kafka: B's producers fenced A's (the transactional ids are the
  job's, not the process's), and the chain would have stopped it next.

The committed output equals a failure-free run's.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import orjson
import pytest

from aiostream_ckpt.connectors.generator import write_generated_jsonl
from aiostream_ckpt.connectors.object_sink import read_object_output
from aiostream_ckpt_dev.demo.kafka import load_jsonl
from aiostream_ckpt_dev.recount import check_pv_updates, recount_inputs
from tests.helpers import DaemonProcess, cli_cmd, make_pv_input

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def _cmd(bootstrap: str, topics: tuple[str, str], prefix: str, local: Path) -> list[str]:
    sets = {
        "job.name": f"pv-{topics[1]}",
        "checkpoint.dir": prefix,
        "checkpoint.local_dir": str(local),
        "checkpoint.interval": "200ms",
        "rest.enabled": "false",
        "restart.delay": "200ms",
        "app.kafka_bootstrap": bootstrap,
        "app.input_topic": topics[0],
        "app.output_topic": topics[1],
        "app.stop_at_end": "1",
    }
    return cli_cmd(
        "run", "apps.pv_count", *(a for k, v in sets.items() for a in ("--set", f"{k}={v}"))
    )


async def test_a_resumed_stale_daemon_cannot_commit(
    kafka_broker, new_topic, read_topic, s3_prefix: str, tmp_path: Path
) -> None:
    events = tmp_path / "events.jsonl"
    write_generated_jsonl(events, 400_000, seed=3, keys=300)
    topics = (await new_topic(2, prefix="in"), await new_topic(2, prefix="out"))
    assert await load_jsonl(kafka_broker.bootstrap_servers, topics[0], events) == 400_000
    bootstrap = kafka_broker.bootstrap_servers

    with DaemonProcess(command=_cmd(bootstrap, topics, s3_prefix, tmp_path / "a")) as a:
        await asyncio.to_thread(a.wait_for, "checkpoint 3 completed", 120)
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            with DaemonProcess(command=_cmd(bootstrap, topics, s3_prefix, tmp_path / "b")) as b:
                code = await asyncio.to_thread(b.wait, 240)
                assert code == 0, b.stderr[-4000:]
                assert "took over " + s3_prefix in b.stderr, b.stderr[-3000:]
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        code = await asyncio.to_thread(a.wait, 120)
        assert code != 0, a.stderr[-4000:]
        # fenced by whichever it reached first: its producers' epoch, or the chain's ETag
        fenced = ("another daemon took over " + s3_prefix, "was fenced: another instance")
        assert any(f in a.stderr for f in fenced), a.stderr[-4000:]

    values = await read_topic(topics[1], timeout_s=60)
    expected, malformed = recount_inputs([events])
    verdict = check_pv_updates(map(orjson.loads, values), expected, malformed=malformed)
    assert verdict.passed, verdict.problems[:10]


def _files_cmd(inputs: list[Path], prefix: str, local: Path) -> list[str]:
    sets = {
        "checkpoint.dir": f"{prefix}/ckpt",
        "checkpoint.local_dir": str(local),
        "checkpoint.interval": "200ms",
        "rest.enabled": "false",
        "job.parallelism": "2",
        "app.input": ",".join(map(str, inputs)),
        "app.output": f"{prefix}/out",
        "app.rate": "4000",
    }
    return cli_cmd(
        "run", "apps.pv_count", *(a for k, v in sets.items() for a in ("--set", f"{k}={v}"))
    )


async def test_the_chain_fences_a_stale_daemon_writing_to_the_store(
    s3_prefix: str, tmp_path: Path
) -> None:
    inputs = [make_pv_input(tmp_path / f"in-{i}.jsonl", 60_000, seed=40 + i) for i in range(2)]
    with DaemonProcess(command=_files_cmd(inputs, s3_prefix, tmp_path / "a")) as a:
        await asyncio.to_thread(a.wait_for, "checkpoint 4 completed", 120)
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            with DaemonProcess(command=_files_cmd(inputs, s3_prefix, tmp_path / "b")) as b:
                code = await asyncio.to_thread(b.wait, 240)
                assert code == 0, b.stderr[-4000:]
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        code = await asyncio.to_thread(a.wait, 120)
        assert code != 0, a.stderr[-4000:]
        assert "another daemon took over " + s3_prefix in a.stderr, a.stderr[-4000:]
        assert "FencedError is not retriable" in a.stderr, a.stderr[-3000:]

    expected, malformed = recount_inputs(inputs)
    updates = await asyncio.to_thread(lambda: list(read_object_output(f"{s3_prefix}/out")))
    verdict = check_pv_updates(updates, expected, malformed=malformed)
    assert verdict.passed, verdict.problems[:10]
