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


class Counting(KeyedProcessFunction[str, int]):
    def open(self, ctx: Any) -> None:
        from aiostream_ckpt.state.descriptors import ValueStateDescriptor

        self.n = ctx.get_state(ValueStateDescriptor("n", default=0))

    def process_element(self, value: str, ctx: Context, out: Collector[int]) -> None:
        self.n.update(self.n.value() + 1)
        out.collect(self.n.value())


def test_keyed_function_on_a_non_keyed_stream_fails_at_build() -> None:
    from aiostream_ckpt.api import StreamEnvironment
    from aiostream_ckpt.errors import JobGraphError

    env = StreamEnvironment("not-keyed")
    src = env.from_collection(["a", "b"])
    with pytest.raises(JobGraphError, match=r"Counting is a KeyedProcessFunction: .*key_by"):
        src.process(Counting())  # type: ignore[arg-type]


def test_keyed_state_in_a_non_keyed_function_fails_at_open_without_restarts() -> None:
    from aiostream_ckpt.api import StreamEnvironment
    from aiostream_ckpt.errors import JobFailedError

    class PlainButStateful(ProcessFunction[str, int]):
        open = Counting.open  # asks for keyed state
        process_element = Counting.process_element  # type: ignore[assignment]

    env = StreamEnvironment("not-keyed")
    env.from_collection(["a", "b"]).process(PlainButStateful(), uid="plain")
    with pytest.raises(JobFailedError) as failed:
        env.execute_and_collect(env.from_collection(["x"]))
    message = str(failed.value)
    assert "not restarted" in message and "after 0 restarts" in message, message
    assert "operator 'plain' asks for keyed state 'n' in open() but is not keyed" in message


@pytest.mark.parametrize("keyed", [False, True])
def test_a_returned_value_is_flagged_once(keyed: bool, caplog: pytest.LogCaptureFixture) -> None:
    from aiostream_ckpt.api import StreamEnvironment

    class Returns(KeyedProcessFunction[int, int]):
        def process_element(self, value: int, ctx: Context, out: Collector[int]) -> None:
            return value * 10  # type: ignore[return-value]  # meant out.collect(value * 10)

    class PlainReturns(ProcessFunction[int, int]):
        def process_element(self, value: int, ctx: Context, out: Collector[int]) -> None:
            return value * 10  # type: ignore[return-value]

    env = StreamEnvironment("returns")
    src = env.from_collection([1, 2, 3])
    stream = src.key_by(lambda v: v).process(Returns()) if keyed else src.process(PlainReturns())
    assert env.execute_and_collect(stream) == []
    warnings = [r.getMessage() for r in caplog.records if "returned" in r.getMessage()]
    name = "Returns" if keyed else "PlainReturns"
    assert warnings == [
        f"operator 'process': {name}.process_element returned 10 instead of emitting it with "
        "out.collect(...): returned values are dropped (warned once)"
    ]


def test_a_process_element_that_yields_is_refused_at_build() -> None:
    from aiostream_ckpt.api import StreamEnvironment
    from aiostream_ckpt.errors import JobGraphError

    class Yields(KeyedProcessFunction[str, str]):
        def process_element(self, value: str, ctx: Context, out: Collector[str]):  # type: ignore[no-untyped-def]
            yield value

    env = StreamEnvironment("yields")
    with pytest.raises(JobGraphError, match=r"Yields.process_element is a generator"):
        env.from_collection(["a"]).key_by(lambda v: v).process(Yields())
