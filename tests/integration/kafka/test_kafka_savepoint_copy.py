"""A savepoint of a Kafka sink stays restorable after a restart aborted its transactions.

Writers in this process against the real broker, driven through the cycle
the runtime drives: checkpoint 1 commits; savepoint 2 pre-commits and keeps
its copy (``hold_for_savepoint``); the job "dies" (its writers close: the
pre-committed transactions stay open on the broker); a restart from
checkpoint 1 fences them (aborted). The savepoint's restore must then write
its records from the copy, once, and the topic read ``read_committed`` must
hold each record of checkpoint 1 and of the savepoint exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt.connectors.base import ConnectorContext, RestoreInfo
from aiostream_ckpt.connectors.kafka.sink import KafkaSink
from aiostream_ckpt.connectors.kafka.writer import TransactionalKafkaWriter
from aiostream_ckpt.errors import RestoreRefusedError, TransactionLostError
from tests.helpers import stable_equals_high_watermark

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    return orjson.loads(orjson.dumps(state))  # type: ignore[no-any-return]


def as_restored(states: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """What each writer recovers at the same parallelism (``runtime.writer_state``)."""
    merged = TransactionalKafkaWriter.merge_states(states)
    return [{**s, "output_end": merged["output_end"]} for s in states]


def tags(values: list[bytes]) -> Counter[str]:
    return Counter(orjson.loads(v)["tag"] for v in values)


async def writers(
    bootstrap: str,
    topic: str,
    prefix: str,
    restored: list[dict[str, Any] | None],
    cid: int | None,
    restore: RestoreInfo | None = None,
) -> list[TransactionalKafkaWriter]:
    # unheld batches: the two writers' records interleave in each partition
    sink = KafkaSink(topic, bootstrap, transactional_id_prefix=prefix, hold_batches=False)
    ws = [
        sink.create_writer(ConnectorContext("job", "sink", k, len(restored), restore=restore))
        for k in range(len(restored))
    ]
    assert all(isinstance(w, TransactionalKafkaWriter) for w in ws)
    try:
        await asyncio.gather(*(w.recover(r, cid) for w, r in zip(ws, restored, strict=True)))
    except BaseException:
        await asyncio.gather(*(w.close() for w in ws))
        raise
    return ws  # type: ignore[return-value]


async def interleaved(ws: list[TransactionalKafkaWriter], tag: str, rounds: int = 4) -> None:
    for i in range(rounds):
        for k, w in enumerate(ws):
            await w.write([{"tag": tag, "w": k, "i": i, "j": j} for j in range(5)])


async def take_savepoint(
    bootstrap: str, topic: str, prefix: str, sp: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Checkpoint 1 committed, savepoint 2 held; then the job dies. Returns both states."""
    ws = await writers(bootstrap, topic, prefix, [None, None], None)
    try:
        await interleaved(ws, "c1")
        chk1 = [roundtrip(await w.prepare_commit(1)) for w in ws]
        for w in ws:
            await w.commit(1)
        await interleaved(ws, "sp")
        pre = [await w.prepare_commit(2) for w in ws]
        sp2 = [
            roundtrip(await w.hold_for_savepoint(2, s, sp / f"sink-{k}/held-writer", sp))
            for k, (w, s) in enumerate(zip(ws, pre, strict=True))
        ]
        await interleaved(ws, "after")  # open when the job dies: never committed
    finally:
        await asyncio.gather(*(w.close() for w in ws))
    return chk1, sp2


async def test_a_restart_aborted_its_transactions_the_restore_writes_the_copy(
    kafka_broker, new_topic, read_topic, tmp_path: Path
) -> None:
    bootstrap, sp = kafka_broker.bootstrap_servers, tmp_path / "sp"
    topic = await new_topic(2)
    prefix = f"spcopy-{uuid.uuid4().hex[:8]}"
    chk1, sp2 = await take_savepoint(bootstrap, topic, prefix, sp)
    for k, state in enumerate(sp2):
        [[txn_id, _, path, _, _, records]] = state["held"]
        assert txn_id.startswith(f"{prefix}-{k}-") and records == 20  # its own, not the other's
        assert (sp / path).is_file()
    # the restart from checkpoint 1 fences (aborts) the savepoint's transactions, then dies
    restart = RestoreInfo("checkpoint", 1, str(tmp_path), "t1")
    ws = await writers(bootstrap, topic, prefix, as_restored(chk1), 1, restart)
    await asyncio.gather(*(w.close() for w in ws))
    assert tags(await read_topic(topic)) == {"c1": 40}
    # the savepoint restores: its aborted transactions are written again from the copies
    restore = RestoreInfo("savepoint", 2, str(sp), "t2")
    ws = await writers(bootstrap, topic, prefix, as_restored(sp2), 2, restore)
    try:
        for k, w in enumerate(ws):
            await w.write([{"tag": "restored", "w": k, "i": 0, "j": 0}])
            await w.prepare_commit(3)
        for w in ws:
            await w.commit(3)
    finally:
        await asyncio.gather(*(w.close() for w in ws))
    values = await read_topic(topic)
    assert tags(values) == {"c1": 40, "sp": 40, "restored": 2}
    seen = Counter((r["tag"], r["w"], r["i"], r["j"]) for r in map(orjson.loads, values))
    assert max(seen.values()) == 1
    await stable_equals_high_watermark(bootstrap, topic, 2)


async def test_restored_into_another_topic_it_writes_nothing_of_the_old_one(
    kafka_broker, new_topic, read_topic, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Blue/green: the new topic starts at the savepoint's positions; the restore is not refused."""
    bootstrap, sp = kafka_broker.bootstrap_servers, tmp_path / "sp"
    blue, green = await new_topic(2), await new_topic(2)
    prefix = f"spblue-{uuid.uuid4().hex[:8]}"
    chk1, sp2 = await take_savepoint(bootstrap, blue, prefix, sp)
    ws = await writers(
        bootstrap, blue, prefix, as_restored(chk1), 1, RestoreInfo("checkpoint", 1, "", "t")
    )
    try:  # the restarted job goes on and commits what it produces again
        await interleaved(ws, "again")
        for w in ws:
            await w.prepare_commit(3)
        for w in ws:
            await w.commit(3)
    finally:
        await asyncio.gather(*(w.close() for w in ws))
    restore = RestoreInfo("savepoint", 2, str(sp), "t2")
    # into the same topic: output after the savepoint's would be written again: refused
    with pytest.raises(RestoreRefusedError, match="would write again"):
        await writers(bootstrap, blue, prefix, as_restored(sp2), 2, restore)
    caplog.set_level(logging.WARNING)
    ws = await writers(bootstrap, green, prefix, as_restored(sp2), 2, restore)
    await asyncio.gather(*(w.close() for w in ws))
    assert "nothing of it is written" in caplog.text
    assert "the savepoint holds its records in sink-" in caplog.text
    assert await read_topic(green) == []
    assert tags(await read_topic(blue)) == {"c1": 40, "again": 40}


async def test_without_a_copy_the_restore_fails_naming_the_loss(
    kafka_broker, new_topic, read_topic, tmp_path: Path
) -> None:
    """A savepoint of a version before copies (its state has none): refused, not silent."""
    bootstrap, sp = kafka_broker.bootstrap_servers, tmp_path / "sp"
    topic = await new_topic(1)
    prefix = f"spnocopy-{uuid.uuid4().hex[:8]}"
    chk1, sp2 = await take_savepoint(bootstrap, topic, prefix, sp)
    ws = await writers(
        bootstrap, topic, prefix, as_restored(chk1), 1, RestoreInfo("checkpoint", 1, "", "t")
    )
    await asyncio.gather(*(w.close() for w in ws))
    old = [{k: v for k, v in s.items() if k != "held"} for s in as_restored(sp2) if s]
    sink = KafkaSink(topic, bootstrap, transactional_id_prefix=prefix)
    w = sink.create_writer(
        ConnectorContext("job", "sink", 0, 2, restore=RestoreInfo("savepoint", 2, str(sp), "t"))
    )
    try:
        with pytest.raises(TransactionLostError, match="holds no copy of it"):
            await w.recover(old[0], 2)
    finally:
        await w.close()
