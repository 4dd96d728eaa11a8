"""Recovery of the Kafka sink after kill -9: rescaling, timed-out transactions, leftovers.

A child process (``sink_crash_child.py``) runs the old writers, completes a
checkpoint whose commit never runs, opens one more transaction per subtask
and is SIGKILLed. The test then recovers new writers, at another parallelism
where the case asks for it, and reads the topic back with ``read_committed``:
every record of a completed checkpoint exactly once, nothing else, and no
open transaction left (the last stable offset is the high watermark), so no
``read_committed`` reader is held back.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.client import AIOKafkaClient

from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.kafka.sink import KafkaSink
from aiostream_ckpt.connectors.kafka.txn_admin import describe_transactions
from aiostream_ckpt.connectors.kafka.writer import TransactionalKafkaWriter
from aiostream_ckpt.errors import TransactionLostError
from tests.helpers import stable_equals_high_watermark

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

CHILD = Path(__file__).parent / "sink_crash_child.py"


async def crash_run(
    subprocess_env: dict[str, str], read_topic: Any, **cfg: Any
) -> list[dict[str, Any]]:
    """Run the old writers in a child until their last checkpoint; kill -9 it; return its states.

    The kill comes once the open transactions' records are on the broker
    (``read_uncommitted`` sees them), so they hold the last stable offset back.
    """
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), json.dumps(cfg),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=subprocess_env,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 120)
        if line:
            tag, want = cfg.get("open_tag", "open"), 3 * cfg["parallelism"]
            async with asyncio.timeout(60):
                while True:
                    got = await read_topic(cfg["topic"], isolation_level="read_uncommitted")
                    if tags(got)[tag] >= want:
                        break
    finally:
        if proc.returncode is None:
            proc.kill()
        stderr = await proc.stderr.read()
        await proc.wait()
    assert line, stderr.decode()[-3000:]
    states: list[dict[str, Any]] = json.loads(line)
    return states


async def recover_at(
    bootstrap: str, topic: str, prefix: str, parallelism: int, restored: dict | None, ckpt: int
) -> list[TransactionalKafkaWriter]:
    sink = KafkaSink(topic, bootstrap, transactional_id_prefix=prefix)
    writers = [
        sink.create_writer(ConnectorContext("job", "sink", k, parallelism))
        for k in range(parallelism)
    ]
    assert all(isinstance(w, TransactionalKafkaWriter) for w in writers)
    await asyncio.gather(*(w.recover(restored, ckpt) for w in writers))
    return writers  # type: ignore[return-value]


def tags(values: list[bytes]) -> Counter[str]:
    return Counter(orjson.loads(v)["tag"] for v in values)


@pytest.mark.parametrize(("old_p", "new_p"), [(4, 2), (2, 1), (1, 2)])
async def test_restore_at_other_parallelism_leaves_no_transaction_open(
    kafka_broker, new_topic, read_topic, subprocess_env, old_p, new_p
):
    bootstrap = kafka_broker.bootstrap_servers
    topic = await new_topic(4)
    prefix = f"rescale-{uuid.uuid4().hex[:8]}"
    states = await crash_run(
        subprocess_env, read_topic, bootstrap=bootstrap, topic=topic, prefix=prefix,
        parallelism=old_p, restored=None, checkpoints=2,
    )  # fmt: skip
    assert len(states) == old_p
    merged = TransactionalKafkaWriter.merge_states(states)
    writers = await recover_at(bootstrap, topic, prefix, new_p, merged, 2)
    try:
        # Checkpoint 1 was committed before the kill, 2 by recovery; the open ones aborted.
        assert tags(await read_topic(topic)) == {"c1": 5 * old_p, "c2": 5 * old_p}
        await stable_equals_high_watermark(bootstrap, topic, 4)
        # The new run goes on, and its output commits too.
        for w in writers:
            await w.write([{"k": "x", "tag": "after"}])
            await w.prepare_commit(3)
            await w.commit(3)
        assert tags(await read_topic(topic)) == {"c1": 5 * old_p, "c2": 5 * old_p, "after": new_p}
    finally:
        await asyncio.gather(*(w.close() for w in writers))


async def test_transactions_of_a_run_that_never_checkpointed_are_aborted(
    kafka_broker, new_topic, read_topic, subprocess_env
):
    """Checkpoint 1 at p1; a run at p3 restores it and dies before its first checkpoint.

    Checkpoint 1 knows only subtask 0: the ids of subtasks 1 and 2 are found
    on the broker (ListTransactions) and fenced by the restore at p1.
    """
    bootstrap = kafka_broker.bootstrap_servers
    topic = await new_topic(2)
    prefix = f"nockpt-{uuid.uuid4().hex[:8]}"
    (state1,) = await crash_run(
        subprocess_env, read_topic, bootstrap=bootstrap, topic=topic, prefix=prefix,
        parallelism=1, restored=None, checkpoints=1,
    )  # fmt: skip
    merged = TransactionalKafkaWriter.merge_states([state1])
    assert await crash_run(
        subprocess_env, read_topic, bootstrap=bootstrap, topic=topic, prefix=prefix,
        parallelism=3, restored=merged, checkpoints=0, first_checkpoint=2, open_tag="open2",
    ) == []  # fmt: skip
    writers = await recover_at(bootstrap, topic, prefix, 1, merged, 1)
    try:
        assert tags(await read_topic(topic)) == {"c1": 5}
        await stable_equals_high_watermark(bootstrap, topic, 2)
    finally:
        await asyncio.gather(*(w.close() for w in writers))


async def test_recovery_commit_of_a_timed_out_transaction_fails_naming_the_loss(
    kafka_broker, new_topic, read_topic, subprocess_env
):
    """The job was down longer than the transaction timeout: checkpoint 1's records are gone."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = await new_topic(1)
    prefix = f"timeout-{uuid.uuid4().hex[:8]}"
    (state1,) = await crash_run(
        subprocess_env, read_topic, bootstrap=bootstrap, topic=topic, prefix=prefix,
        parallelism=1, restored=None, checkpoints=1, timeout_ms=1000,
    )  # fmt: skip
    txn_id = state1["pending"][0][1]
    await until_aborted_by_broker(bootstrap, txn_id)
    sink = KafkaSink(topic, bootstrap, transactional_id_prefix=prefix)
    writer = sink.create_writer(ConnectorContext("job", "sink", 0, 1))
    try:
        with pytest.raises(TransactionLostError) as info:
            await writer.recover(state1, 1)
    finally:
        await writer.close()
    message = str(info.value)
    assert not info.value.retriable
    assert "checkpoint 1" in message and txn_id in message, message
    assert re.search(rf"{re.escape(topic)}\[0\] offsets 0\.\.4\b", message), message
    assert "transaction_timeout_ms" in message and "transaction.max.timeout.ms" in message
    assert await read_topic(topic) == []


async def until_aborted_by_broker(bootstrap: str, txn_id: str, timeout_s: float = 60) -> None:
    """Wait for the broker's timeout check to abort ``txn_id`` (an external event: polled)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                (info,) = await describe_transactions(client, [txn_id])
                if info.state == "CompleteAbort":
                    return
                await asyncio.sleep(0.2)
    finally:
        await client.close()
