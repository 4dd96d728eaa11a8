"""Window contents of a declared type read back as that type after a restore.

``aggregate(accumulator_type=)``, ``reduce(value_type=)`` and
``process(element_type=)`` declare what the windows hold; a snapshot taken
while a window is open (tumbling buffer, held sessions: written at the
pre-barrier flush) restores it with its accumulator's dataclass, datetime,
frozenset and tuple, so the window's result is the failure-free one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.jobspec.graph import WindowKind, WindowSpec
from aiostream_ckpt.jobspec.window_functions import AggregateFunction, ProcessWindowFunction
from aiostream_ckpt.jobspec.windows import EventTimeSessionWindows, TumblingEventTimeWindows
from tests.unit.runtime.windowing.test_window_buffer import _snapshot_restore
from tests.unit.time.support import open_window_operator, window_backend

WHEN = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Acc:
    n: int
    last: datetime
    keys: frozenset[str]
    pair: tuple[int, str]


def _types(value: Any) -> str:
    """The value's type and its fields' (what changes after a restore that loses types)."""
    fields = value.__dict__.values() if isinstance(value, Acc) else value
    return f"{type(value).__name__}({','.join(type(f).__name__ for f in fields)})"


class Visits(AggregateFunction[tuple[int, datetime], Acc, str]):
    def create_accumulator(self) -> Acc:
        return Acc(0, WHEN, frozenset(), (0, ""))

    def add(self, value: tuple[int, datetime], acc: Acc) -> Acc:
        return Acc(acc.n + 1, value[1], acc.keys | {str(value[0])}, (value[0], "x"))

    def get_result(self, acc: Acc) -> str:
        return f"{_types(acc)}:{acc.n}"

    def merge(self, a: Acc, b: Acc) -> Acc:
        return Acc(a.n + b.n, max(a.last, b.last), a.keys | b.keys, max(a.pair, b.pair))


class Elements(ProcessWindowFunction[tuple[int, datetime], str, Any]):
    def process(self, key: Any, context: Any, elements: Any, out: Any) -> None:
        out.collect(";".join(_types(e) for e in elements))


FUNCTIONS: dict[WindowKind, tuple[Any, Any]] = {
    WindowKind.AGGREGATE: (Visits(), Acc),
    WindowKind.REDUCE: (lambda a, b: (a[0] + b[0], b[1]), tuple[int, datetime]),
    WindowKind.PROCESS: (Elements(), list[tuple[int, datetime]]),
}


@pytest.mark.parametrize("kind", list(WindowKind))
@pytest.mark.parametrize("session", [False, True], ids=["tumbling", "session"])
def test_typed_contents_survive_a_restore_of_an_open_window(
    tmp_path: Path, kind: WindowKind, session: bool
) -> None:
    function, state_type = FUNCTIONS[kind]
    spec = WindowSpec(
        assigner=EventTimeSessionWindows.with_gap(300)
        if session
        else TumblingEventTimeWindows.of(500),
        kind=kind,
        timestamp_assigner=lambda e: e[0],
        function=function,
        allowed_lateness=0,
        late_tag=None,
        state_type=state_type,
    )

    def opened(backend: Any) -> Any:
        op = open_window_operator(spec, lambda e: "k", backend)
        op.side_output = []
        return op

    records = [(1, WHEN), (2, WHEN), (3, WHEN)]
    ref = opened(window_backend(tmp_path / "ref", "w"))
    want = ref.process_batch(records) + ref.process_watermark(10_000)
    before = opened(window_backend(tmp_path / "before", "w"))
    got = before.process_batch(records[:2])
    after = opened(_snapshot_restore(before, tmp_path, 1))
    got += after.process_batch(records[2:]) + after.process_watermark(10_000)
    assert got == want
    sig = want[0] if isinstance(want[0], str) else _types(want[0])  # reduce: the value
    assert "datetime" in sig and "list" not in sig, sig
    for op in (ref, before, after):
        op.backend.close()
