"""Rolling part files: a part file spans checkpoints, committed files never change.

The open file's length at each checkpoint is in the writer state; a restore
commits exactly that prefix (the records the checkpoint covers), wherever the
file went after the checkpoint: still open, pre-committed by a checkpoint that
never completed, or committed by one being gone back from.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, RollingPolicy
from aiostream_ckpt.connectors.staging import (
    StagedFileWriter,
    committed_files,
    read_committed_output,
)


async def writer(
    d: Path, restored: Any = None, cid: int | None = None, *, clock: ManualClock | None = None,
    rolling: RollingPolicy | None = None,
) -> StagedFileWriter:  # fmt: skip
    c = ConnectorContext("job", "sink", 0, 1, clock=clock or ManualClock())
    sink = ExactlyOnceFileSink(d, rolling=rolling or RollingPolicy(max_bytes=1000))
    w = sink.create_writer(c)
    await w.recover(restored, cid)
    return w


def recs(a: int, b: int) -> list[dict[str, int]]:
    return [{"n": i} for i in range(a, b)]


async def test_a_part_file_spans_checkpoints_until_a_limit(tmp_path: Path) -> None:
    w = await writer(tmp_path)
    for cid in (1, 2, 3):
        await w.write(recs(cid * 10, cid * 10 + 10))  # ~100 bytes per checkpoint
        await w.prepare_commit(cid)
        await w.commit(cid)
    assert committed_files(tmp_path) == [], "still open: below 1000 bytes"
    await w.write(recs(100, 200))
    await w.prepare_commit(4)
    await w.commit(4)
    (part,) = committed_files(tmp_path)
    assert part.name == "part-0000000004-0000.jsonl"
    assert [r["n"] for r in read_committed_output(tmp_path)] == [*range(10, 40), *range(100, 200)]


async def test_age_limit_rolls_by_the_injected_clock(tmp_path: Path) -> None:
    clock = ManualClock()
    w = await writer(tmp_path, clock=clock, rolling=RollingPolicy(max_seconds=60))
    await w.write(recs(0, 5))
    await w.prepare_commit(1)
    assert committed_files(tmp_path) == [] and w.state()["open"]
    clock.advance(61)
    await w.prepare_commit(2)
    await w.commit(2)
    assert len(committed_files(tmp_path)) == 1


@pytest.mark.parametrize("went", ["still-open", "pending-later", "committed-later"])
async def test_restore_commits_exactly_the_checkpointed_prefix(tmp_path: Path, went: str) -> None:
    w = await writer(tmp_path)
    await w.write(recs(0, 10))
    state1 = await w.prepare_commit(1)  # open file: 10 records covered by checkpoint 1
    await w.commit(1)
    await w.write(recs(10, 200))  # after barrier 1: replayed after a restore to 1
    if went != "still-open":
        await w.prepare_commit(2)  # rolls (over 1000 bytes): the file is pending for 2
        if went == "committed-later":
            await w.commit(2)
    # kill -9 here: no close(); a new attempt restores checkpoint 1
    w2 = await writer(tmp_path, state1, 1)
    assert [r["n"] for r in read_committed_output(tmp_path)] == list(range(10))
    assert [p.name for p in committed_files(tmp_path)] == ["part-0000000001-0000.jsonl"]
    staged = [n for n in os.listdir(tmp_path) if n.startswith(".part")]
    assert staged == [], staged
    # the resumed prefix is committed once, whatever recovery is redone
    w3 = await writer(tmp_path, state1, 1)
    assert [r["n"] for r in read_committed_output(tmp_path)] == list(range(10))
    await w2.close()
    await w3.close()


async def test_stopping_keeps_a_checkpointed_open_file_for_the_next_start(tmp_path: Path) -> None:
    w = await writer(tmp_path)
    await w.write(recs(0, 10))
    state1 = await w.prepare_commit(1)
    await w.commit(1)
    await w.close()  # a graceful stop after checkpoint 1
    await writer(tmp_path, state1, 1)
    assert [r["n"] for r in read_committed_output(tmp_path)] == list(range(10))


async def test_end_of_input_rolls_whatever_the_size(tmp_path: Path) -> None:
    w = await writer(tmp_path)
    await w.write(recs(0, 3))
    w.request_roll()
    await w.prepare_commit(1)
    await w.commit(1)
    assert [r["n"] for r in read_committed_output(tmp_path)] == [0, 1, 2]
