"""Windows snapshotted and restored at another parallelism give what one run gives.

A random stream (out of order, late and very late records, late firings) runs
through one operator; at random barriers its snapshot is restored into two
instances that split the key groups (1 -> 2), and later their snapshots into
one again (2 -> 1), each resuming at the watermark of the barrier. The
operators hold at most two keys' sessions or two tumbling windows between
barriers (``max_held``: the rest is written after its batch), so a held-cap
write, a barrier flush and a restore meet the same keys.
The output and the late records must be those of the run without restores.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.jobspec.graph import WindowKind
from aiostream_ckpt.keygroups import KeyGroupRange, key_group_of
from aiostream_ckpt.state.backend import SnapshotTarget, StateHandle
from aiostream_ckpt.state.lmdb import LmdbStateBackend
from tests.unit.runtime.windowing.test_window_fast_paths import _operator
from tests.unit.time.support import WINDOW_MAXP

Steps = list[tuple[list[dict[str, Any]], int]]


def _stream(seed: int) -> Steps:
    rng = random.Random(seed)
    steps, now = [], 0
    for _ in range(80):
        batch = []
        for _ in range(rng.randint(0, 30)):
            lag = rng.choice([0, 0, 0, 50, 200, 900, 3_000])
            batch.append({"k": f"k{rng.randint(0, 7)}", "ts": max(0, now - lag), "v": 1})
            now += rng.randint(0, 60)
        steps.append((batch, now - 400))
    return steps


def _backend(tmp: Path, name: str, kgs: KeyGroupRange) -> LmdbStateBackend:
    return LmdbStateBackend(
        operator_uid="w",
        subtask_index=0,
        key_group_range=kgs,
        max_parallelism=WINDOW_MAXP,
        local_dir=tmp / name,
    )


def _snapshot(op: Any, root: Path, cid: int) -> StateHandle:
    op.prepare_snapshot_pre_barrier(cid)
    target = SnapshotTarget(cid, root, root / f"chk-{cid}-{id(op)}", root / "shared")
    part = op.backend.snapshot(target)
    asyncio.run(part.prepare())
    handle = part.write()
    asyncio.run(part.settle())
    return handle


def _feed(ops: list[Any], ranges: list[KeyGroupRange], batch: list[Any], wm: int) -> Counter[str]:
    """Each record to the instance owning its key group, then the watermark to all."""
    got: Counter[str] = Counter()
    for op, kgs in zip(ops, ranges, strict=True):
        mine = [r for r in batch if key_group_of(r["k"], WINDOW_MAXP) in kgs]
        got.update(repr(o) for o in op.process_batch(mine))
        op.end_batch()
        got.update(repr(("late", r)) for _, r in op.side_output)
        op.side_output.clear()
    for op in ops:
        got.update(repr(o) for o in op.process_watermark(wm))
        op.end_batch()
    return got


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("session", [True, False], ids=["session", "tumbling"])
@pytest.mark.parametrize("lateness", [0, 700])
def test_restores_at_another_parallelism_give_the_output_of_one_run(
    tmp_path: Path, seed: int, session: bool, lateness: int
) -> None:
    steps = _stream(seed)
    kind = WindowKind.PROCESS if seed % 2 else WindowKind.AGGREGATE
    everything = KeyGroupRange(0, WINDOW_MAXP - 1)
    halves = [KeyGroupRange(0, 63), KeyGroupRange(64, WINDOW_MAXP - 1)]

    def make(name: str, kgs: KeyGroupRange, handles: list[StateHandle] | None) -> Any:
        backend = _backend(tmp_path, name, kgs)
        if handles is not None:
            backend.restore(tmp_path / "ckpt", handles)
        op = _operator(tmp_path, session=session, kind=kind, lateness=lateness, backend=backend)
        op.max_held = 2
        return op

    reference = make("ref", everything, None)
    want: Counter[str] = Counter()
    for batch, wm in steps:
        want += _feed([reference], [everything], batch, wm)
    want += _feed([reference], [everything], [], 1 << 40)
    reference.backend.close()

    rng = random.Random(seed)
    split_at, join_at = sorted(rng.sample(range(5, len(steps) - 5), 2))
    (tmp_path / "ckpt").mkdir()
    ops, ranges = [make("one", everything, None)], [everything]
    got: Counter[str] = Counter()
    for i, (batch, wm) in enumerate(steps):
        got += _feed(ops, ranges, batch, wm)
        if i in (split_at, join_at):
            handles = [_snapshot(op, tmp_path / "ckpt", i) for op in ops]
            for op in ops:
                op.backend.close()
            ranges = halves if i == split_at else [everything]
            ops = [make(f"{i}-{n}", kgs, handles) for n, kgs in enumerate(ranges)]
            for op in ops:
                op.restore_watermark(wm)
    got += _feed(ops, ranges, [], 1 << 40)
    for op in ops:
        op.backend.close()
    assert got == want
