"""Which restored state a sink writer gets: its own, or all merged when rescaled."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.connectors.staging import StagedFileWriter, read_committed_output
from aiostream_ckpt.errors import StateMigrationError
from aiostream_ckpt.runtime.writer_state import restored_writer_state
from tests.helpers import completed_checkpoint


def checkpoint(parallelism: int, states: dict[int, dict[str, Any] | None]) -> CompletedCheckpoint:
    subtasks = {i: {"keyed": None, "operator": {"writer": st}} for i, st in states.items()}
    return completed_checkpoint("sink", parallelism, subtasks)


OLD = {0: {"pending": [["a0", "A0"]]}, 1: {"pending": [["a1", "A1"], ["b1", "B1"]]}}
MERGED = {"pending": [["a0", "A0"], ["a1", "A1"], ["b1", "B1"]]}


class NoMerge:
    pass


def state_for(chk: CompletedCheckpoint, sub: int, p: int, writer: object) -> Any:
    return restored_writer_state(chk, "sink", "writer", subtask=sub, parallelism=p, writer=writer)


def test_same_parallelism_keeps_own_state() -> None:
    chk = checkpoint(2, OLD)
    assert state_for(chk, 1, 2, NoMerge()) == OLD[1]
    assert state_for(chk, 0, 2, NoMerge()) == OLD[0]


@pytest.mark.parametrize("new_p", [1, 3])
def test_rescaled_writers_all_get_the_merged_state(new_p: int, tmp_path: Path) -> None:
    chk = checkpoint(2, OLD)
    for sub in range(new_p):
        writer = StagedFileWriter(tmp_path, subtask=sub, parallelism=new_p)
        assert state_for(chk, sub, new_p, writer) == MERGED


def test_writer_without_merge_is_refused_when_rescaled() -> None:
    with pytest.raises(StateMigrationError, match="parallelism 2 and cannot be restored at 1"):
        state_for(checkpoint(2, OLD), 0, 1, NoMerge())
    assert state_for(checkpoint(2, {0: None, 1: None}), 0, 1, NoMerge()) is None


async def test_merged_recovery_commits_every_old_subtask_once(tmp_path: Path) -> None:
    """p=2 -> p=1 and p=3: each old subtask's pre-committed file is committed exactly once."""
    for new_p in (1, 3):
        out = tmp_path / f"out{new_p}"
        olds = [StagedFileWriter(out, subtask=i, parallelism=2) for i in range(2)]
        states = {}
        for i, w in enumerate(olds):
            await w.recover(None, None)
            await w.write([{"sub": i}])
            states[i] = await w.prepare_commit(7)
            await w.write([{"lost": i}])  # open transaction at the savepoint: never committed
            await w.close()
        chk = checkpoint(2, states)
        news = [StagedFileWriter(out, subtask=i, parallelism=new_p) for i in range(new_p)]
        await asyncio.gather(
            *(w.recover(state_for(chk, i, new_p, w), 7) for i, w in enumerate(news))
        )
        assert sorted(r["sub"] for r in read_committed_output(out)) == [0, 1]
        assert not [p for p in out.iterdir() if p.name.startswith(".")], "staged files left"
