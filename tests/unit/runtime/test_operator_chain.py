"""The record path: a keyed operator keeps its state caches bounded, the chain says when."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiostream_ckpt.api.functions import Collector, Context, KeyedProcessFunction, RuntimeContext
from aiostream_ckpt.runtime.chain import ChainSpec, TaskMetrics
from aiostream_ckpt.runtime.operator_chain import OperatorChain
from aiostream_ckpt.runtime.operators import KeyedProcessOperator
from aiostream_ckpt.state.descriptors import ValueStateDescriptor
from aiostream_ckpt.state.keygroups import KeyGroupRange
from aiostream_ckpt.state.lmdb import LmdbStateBackend

LIMIT = 50
KEYS_PER_BATCH = 200


class LastSeen(KeyedProcessFunction[int, int]):
    """Blind writes (``update`` without a read): the one path with no size check per write."""

    def open(self, ctx: RuntimeContext) -> None:
        self.last = ctx.get_state(ValueStateDescriptor("last"))

    def process_element(self, value: int, ctx: Context, out: Collector[int]) -> None:
        self.last.update(value)
        out.collect(value)


class ListWriter:
    def __init__(self) -> None:
        self.written: list[Any] = []

    async def write(self, batch: list[Any]) -> None:
        self.written.extend(batch)


def _operator(tmp: Path) -> tuple[KeyedProcessOperator, LmdbStateBackend]:
    op = KeyedProcessOperator("last", LastSeen(), lambda rec: rec)
    backend = LmdbStateBackend(
        operator_uid="last",
        subtask_index=0,
        key_group_range=KeyGroupRange(0, 127),
        max_parallelism=128,
        local_dir=tmp,
        cache_max_entries=LIMIT,
    )
    op.backend = backend
    op.open(
        RuntimeContext(
            operator_uid="last", subtask_index=0, parallelism=1, params={}, backend=backend
        )
    )
    return op, backend


def _batch(i: int) -> list[int]:
    return list(range(i * KEYS_PER_BATCH, (i + 1) * KEYS_PER_BATCH))


def test_keyed_operator_bounds_its_caches_at_the_end_of_a_batch(tmp_path: Path) -> None:
    op, backend = _operator(tmp_path)
    try:
        op.process_batch(_batch(0))
        assert backend.cached_entries("last") == KEYS_PER_BATCH  # no check per write
        op.end_batch()
        assert backend.cached_entries("last") <= LIMIT
    finally:
        backend.close()


def test_chain_ends_every_batch_of_its_keyed_operators(tmp_path: Path) -> None:
    op, backend = _operator(tmp_path)
    writer = ListWriter()
    spec = ChainSpec(task_id="t", subtask=0, parallelism=1, operators=[op], writer=writer)
    chain = OperatorChain(spec, TaskMetrics())
    try:
        for i in range(3):
            asyncio.run(chain.push(_batch(i)))
            assert backend.cached_entries("last") <= LIMIT
        assert writer.written == [*_batch(0), *_batch(1), *_batch(2)]
    finally:
        backend.close()
