"""A savepoint's own copy of the Kafka transactions it lists as pre-committed.

What Flink does: an intermediate savepoint (not stop-with-savepoint) commits
nothing (1.15+); the ``KafkaCommitter`` of a job restored from it resumes the
stored transactions by producer id and epoch and commits them. A transaction
cannot stay open for ever: the broker aborts it at ``transaction.timeout.ms``,
and the job's own restart aborts it too (its ``TransactionAborter`` fences the
ids of checkpoints after the one it restored, which include the savepoint's).
Flink then logs that the commit failed and that this "most likely signals
data loss", and goes on without those records.

Here a savepoint is restorable whatever happened after it, within what Kafka
keeps. Holding its transactions open is not an option: an open transaction
holds back every ``read_committed`` consumer of its partitions (the last
stable offset stops at its first record), so the restarted job's output would
stay invisible until the timeout. So, at the savepoint, each writer reads its
pre-committed transactions back from the topic (``read_uncommitted``, at the
offsets it recorded for them, keeping the batches of the transaction's
producer id and epoch: other writers' records interleave) and stores them
inside the savepoint, with their partition, key, value, headers and
timestamp. A restore of the savepoint then:

- commits each listed transaction still open (EndTxn, as for a checkpoint);
- leaves one that is visible to ``read_committed`` (committed by the
  checkpoint after the savepoint);
- writes the copy of one that was aborted (by a restart, or its timeout) into
  its first transaction, which the first checkpoint after the restore commits:
  the records reach the topic once, in their partitions, before anything the
  restored job writes; restored into another topic (blue/green) it writes
  nothing there and says so, as the file sink starts a new directory at the
  savepoint's positions.

What it cannot do: bring back records the topic's retention deleted before
the copy was read (the copy is read at the savepoint, seconds after the
records were written), or a transaction whose state lists no offsets (written
by versions before offsets were recorded): then the restore fails naming it.
The copy costs one read of the pre-committed output per savepoint (nothing per
record); it is part of the savepoint, removed when the savepoint is disposed of.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiokafka import TopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.memory_records import MemoryRecords

from aiostream_ckpt.connectors.held_output import sha256_of
from aiostream_ckpt.durable import child_path, fsync_dir
from aiostream_ckpt.errors import ConnectorError

#: One record of a held transaction: partition, offset, key, value, headers, timestamp (ms).
HeldRecord = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes]], int]

_FETCH_BYTES = 4 << 20
_READ_UNCOMMITTED = 0


@dataclass(frozen=True, slots=True)
class HeldTransaction:
    """The savepoint's copy of one pre-committed transaction (a writer state's ``held`` row)."""

    transactional_id: str
    producer_epoch: int
    #: relative to the savepoint directory
    path: str
    size: int
    sha256: str
    records: int

    def to_state(self) -> list[Any]:
        return [
            self.transactional_id,
            self.producer_epoch,
            self.path,
            self.size,
            self.sha256,
            self.records,
        ]

    @classmethod
    def from_state(cls, entry: Sequence[Any]) -> HeldTransaction:
        tid, epoch, path, size, sha, records = entry
        return cls(str(tid), int(epoch), str(path), int(size), str(sha), int(records))

    @property
    def key(self) -> tuple[str, int]:
        return self.transactional_id, self.producer_epoch


async def read_transaction(
    client: Any,
    topic: str,
    producer_id: int,
    producer_epoch: int,
    ranges: dict[int, list[int]],
    *,
    timeout_s: float,
) -> list[HeldRecord]:
    """Read one transaction's records back from ``topic`` (``read_uncommitted``).

    ``ranges``: per partition, the first and last offset the transaction
    wrote; the records between that another producer (or epoch) wrote are
    left out. Raises :class:`ConnectorError` when the range cannot be read
    whole (deleted by retention, not replicated in time).
    """
    out: list[HeldRecord] = []
    deadline = time.monotonic() + timeout_s
    for partition, (first, last) in sorted(ranges.items()):
        tp = TopicPartition(topic, partition)
        offset = first
        while offset <= last:
            if time.monotonic() > deadline:
                raise ConnectorError(
                    f"cannot read back {topic}[{partition}] offsets {offset}..{last} for a "
                    f"savepoint's copy within {timeout_s:g}s",
                    retriable=True,
                )
            data = await _fetch(client, tp, offset)
            records = MemoryRecords(data) if data else None
            moved = False
            while records is not None and records.has_next():
                batch = records.next_batch()
                if batch is None:
                    break
                ours = (
                    batch.producer_id == producer_id
                    and batch.producer_epoch == producer_epoch
                    and not batch.is_control_batch
                )
                for rec in batch:
                    if rec.offset < offset or rec.offset > last:
                        continue
                    if ours:
                        headers = [(k, bytes(v)) for k, v in rec.headers]
                        row = (partition, rec.offset, rec.key, rec.value, headers, rec.timestamp)
                        out.append(row)
                offset = max(offset, batch.next_offset)
                moved = True
            if not moved:
                await asyncio.sleep(0.05)
        held = {o for p, o, *_ in out if p == partition}
        if first not in held or last not in held:
            raise ConnectorError(
                f"the savepoint's copy of {topic}[{partition}] offsets {first}..{last} found "
                f"no record of producer {producer_id} (epoch {producer_epoch}) at "
                f"{'the first' if first not in held else 'the last'} of them",
                retriable=False,
            )
    return out


async def _fetch(client: Any, tp: TopicPartition, offset: int) -> bytes:
    """One Fetch of ``tp`` from ``offset`` at its leader; the raw record batches."""
    leader = client.cluster.leader_for_partition(tp)
    if leader is None or leader == -1:
        await client.force_metadata_update()
        leader = client.cluster.leader_for_partition(tp)
        if leader is None or leader == -1:
            raise ConnectorError(f"{tp.topic}[{tp.partition}] has no leader", retriable=True)
    request = FetchRequest(
        200,
        1,
        _FETCH_BYTES,
        _READ_UNCOMMITTED,
        [(tp.topic, [(tp.partition, offset, _FETCH_BYTES)])],
    )
    try:
        response = await client.send(leader, request)
    except kafka_errors.KafkaError as exc:
        raise ConnectorError(f"cannot read back {tp}: {exc}", retriable=True) from exc
    for _, partitions in response.topics:
        for _, error_code, _, *part_data in partitions:
            error = kafka_errors.for_code(error_code)
            if error is not kafka_errors.NoError:
                raise ConnectorError(
                    f"cannot read back {tp.topic}[{tp.partition}] from offset {offset} for a "
                    f"savepoint's copy: {error.__name__}",
                    retriable=error is not kafka_errors.OffsetOutOfRangeError,
                )
            return bytes(part_data[-1] or b"")
    return b""


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(data: str | None) -> bytes | None:
    return None if data is None else base64.b64decode(data)


def write_copy(
    records: list[HeldRecord],
    directory: Path,
    name: str,
    root: Path,
    transactional_id: str,
    producer_epoch: int,
) -> HeldTransaction:
    """Write ``records`` to ``directory/name`` (JSON lines, fsynced); describe the copy."""
    directory.mkdir(parents=True, exist_ok=True)
    path = child_path(directory, name)
    with open(path, "wb") as f:
        for p, o, k, v, h, t in records:
            row = [p, o, _b64(k), _b64(v), [[hk, _b64(hv)] for hk, hv in h], t]
            f.write(orjson.dumps(row) + b"\n")
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(directory)
    rel = path.relative_to(root).as_posix()
    return HeldTransaction(
        transactional_id, producer_epoch, rel, path.stat().st_size, sha256_of(path), len(records)
    )


def read_copy(root: Path, held: HeldTransaction) -> list[HeldRecord]:
    """Read a copy back, checked against its size, sha256 and record count."""
    path = root / held.path
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ConnectorError(
            f"the savepoint's copy {path} of transaction {held.transactional_id} is missing",
            retriable=False,
        ) from None
    if size != held.size or sha256_of(path) != held.sha256:
        raise ConnectorError(
            f"the savepoint's copy {path} of transaction {held.transactional_id} does not "
            "match its size and sha256",
            retriable=False,
        )
    out: list[HeldRecord] = []
    with open(path, "rb") as f:
        for line in f:
            p, o, k, v, h, t = orjson.loads(line)
            headers = [(str(hk), _unb64(hv) or b"") for hk, hv in h]
            out.append((int(p), int(o), _unb64(k), _unb64(v), headers, int(t)))
    if len(out) != held.records:
        raise ConnectorError(
            f"the savepoint's copy {path} holds {len(out)} records, not {held.records}",
            retriable=False,
        )
    return out
