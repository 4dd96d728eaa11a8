"""Process operators: what a function emits, and when its collector may be used."""

from __future__ import annotations

from typing import Any

import pytest

from aiostream_ckpt.api.functions import (
    Collector,
    Context,
    KeyedProcessFunction,
    ProcessFunction,
)
from aiostream_ckpt.runtime.operators import KeyedProcessOperator, ProcessOperator


class Twice(KeyedProcessFunction[int, Any]):
    """Emits every record twice, tagged with its key; keeps its collector."""

    def __init__(self) -> None:
        self.kept: Collector[Any] | None = None

    def process_element(self, value: int, ctx: Context, out: Collector[Any]) -> None:
        self.kept = out
        out.collect((ctx.current_key, value))
        out.collect((ctx.current_key, value))


@pytest.mark.parametrize("keyed", [False, True])
def test_collector_emits_into_its_batch_only(keyed: bool) -> None:
    fn = Twice()
    op: ProcessOperator = (
        KeyedProcessOperator("op", fn, lambda v: v % 2) if keyed else ProcessOperator("op", fn)
    )
    key = (lambda v: v % 2) if keyed else (lambda v: None)
    assert op.process_batch([1, 2]) == [(key(1), 1), (key(1), 1), (key(2), 2), (key(2), 2)]
    # The output batch is handed over (and freed after the sink wrote it): a late
    # emit names the mistake instead of going into a batch nobody reads.
    assert fn.kept is not None
    with pytest.raises(RuntimeError, match="outside of record processing"):
        fn.kept.collect((0, 0))
    assert op.process_batch([3]) == [(key(3), 3), (key(3), 3)]


def test_plain_process_function_gets_no_key() -> None:
    class Upper(ProcessFunction[str, str]):
        def process_element(self, value: str, ctx: Context, out: Collector[str]) -> None:
            out.collect(value.upper())

    assert ProcessOperator("up", Upper()).process_batch(["a", "b"]) == ["A", "B"]
