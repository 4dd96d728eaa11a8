"""Each chained operator's records in and out (Flink's operator ``numRecordsIn/Out``).

A task's counters cover its chain as a whole; a filter or a flat_map inside
the chain showed nothing of what it drops or expands. The chain counts each
operator's output once per batch (never per record), on every path records
take: batches, timers, end-of-input flushes, records a function failed on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiostream_ckpt.runtime.chain import ChainSpec, TaskMetrics
from aiostream_ckpt.runtime.event_time import fire_chain
from aiostream_ckpt.runtime.operator_chain import OperatorChain
from aiostream_ckpt.runtime.operators import FilterOperator, FlatMapOperator, MapOperator
from aiostream_ckpt.runtime.task_report import operator_records


class ListWriter:
    def __init__(self) -> None:
        self.written: list[Any] = []

    async def write(self, batch: list[Any]) -> None:
        self.written.extend(batch)


class DeadLetters:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def add_failed_record(self, record: Any, uid: str, *_: Any) -> None:
        self.records.append((uid, record))


def _chain(
    dead_letters: DeadLetters | None = None,
) -> tuple[OperatorChain, ChainSpec, TaskMetrics, ListWriter]:
    ops = [
        MapOperator("double", lambda x: 2 * x if x >= 0 else 1 // 0),
        FilterOperator("fours", lambda x: x % 4 == 0),
        FlatMapOperator("twice", lambda x: [x, x]),
    ]
    writer = ListWriter()
    spec = ChainSpec(task_id="t-0", subtask=0, parallelism=1, operators=ops, writer=writer)  # type: ignore[arg-type]
    if dead_letters is not None:  # errors.on_process_error=dead_letter
        spec.dead_letter, spec.process_error_limit = dead_letters, 10  # type: ignore[assignment]
    metrics = TaskMetrics()
    return OperatorChain(spec, metrics), spec, metrics, writer


def _push(chain: OperatorChain, metrics: TaskMetrics, batch: list[int]) -> None:
    metrics.records_in += len(batch)  # as the task counts what it takes in
    asyncio.run(chain.push(batch))


def test_each_operator_of_a_map_filter_flat_map_chain_counts_its_records() -> None:
    chain, spec, metrics, writer = _chain()
    _push(chain, metrics, list(range(10)))  # doubled: 0..18, half of them multiples of 4
    _push(chain, metrics, [1, 3])  # doubled: 2, 6; the filter drops both, flat_map sees none
    assert operator_records(spec, metrics) == [
        {"operator": "double", "records_in": 12, "records_out": 12},
        {"operator": "fours", "records_in": 12, "records_out": 5},
        {"operator": "twice", "records_in": 5, "records_out": 10},
    ]
    assert metrics.records_out == len(writer.written) == 10


def test_end_of_input_flushes_count_as_the_flushing_operators_output() -> None:
    chain, spec, metrics, _ = _chain()
    map_op = spec.operators[0]
    map_op.finish = lambda: [4, 5]  # type: ignore[method-assign]  # e.g. a final window
    asyncio.run(chain.finish())
    records = {r["operator"]: r for r in operator_records(spec, metrics)}
    assert records["double"]["records_out"] == 2
    assert records["fours"] == {"operator": "fours", "records_in": 2, "records_out": 1}
    assert records["twice"]["records_out"] == 2


def test_timer_output_counts_as_the_firing_operators_output() -> None:
    chain, spec, metrics, _ = _chain()
    fired = fire_chain(
        spec.operators, lambda op: [8, 9] if op.uid == "double" else [], chain.operator_failed
    )
    assert fired == [8, 8]
    assert [r["records_out"] for r in operator_records(spec, metrics)] == [2, 1, 2]


def test_a_dead_lettered_record_is_in_but_not_out_of_the_operator_it_failed_in() -> None:
    dead = DeadLetters()
    chain, spec, metrics, writer = _chain(dead)
    _push(chain, metrics, [6, -1, 8])  # -1: the map raises, the rest goes on
    assert dead.records == [("double", -1)]
    assert operator_records(spec, metrics) == [
        {"operator": "double", "records_in": 3, "records_out": 2},
        {"operator": "fours", "records_in": 2, "records_out": 2},
        {"operator": "twice", "records_in": 2, "records_out": 4},
    ]
    assert writer.written == [12, 12, 16, 16]
