"""The window operators' inlined record paths give what their general paths give.

Tumbling windows and sessions of an aggregate fold most records inline (see
``WindowOperator._add_tumbling`` and ``SessionWindowOperator.process_batch``);
the general loops stay for other assigners and rare cases. Each test runs
the same batches and watermarks (out of order, late and very late records,
late firings, a failing record) through an operator on its inlined path and
one forced onto the general path, and compares output, late records and
state after every step.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.jobspec.functions import OutputTag
from aiostream_ckpt.jobspec.graph import WindowKind, WindowSpec
from aiostream_ckpt.jobspec.window_functions import AggregateFunction
from aiostream_ckpt.runtime.operators import RecordFailed
from aiostream_ckpt.runtime.windowing.session_windows import SESSIONS, SessionWindowOperator
from aiostream_ckpt.runtime.windowing.window_operator import WINDOW_APPENDS, WINDOW_CONTENTS
from aiostream_ckpt.time import EventTimeSessionWindows, TumblingEventTimeWindows
from tests.unit.time.support import open_window_operator, window_backend

MAXP = 128
LATE: OutputTag[Any] = OutputTag("late")


class SumOrFail(AggregateFunction[dict[str, Any], int, int]):
    """Sums ``v``; raises on a record marked ``bad`` (the batch's RecordFailed)."""

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: dict[str, Any], accumulator: int) -> int:
        if value.get("bad"):
            raise ValueError("bad record")
        return accumulator + value["v"]

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, a: int, b: int) -> int:
        return a + b


def _operator(
    tmp: Path, *, session: bool, kind: WindowKind, lateness: int, backend: Any = None
) -> Any:
    function: Any = {
        WindowKind.AGGREGATE: SumOrFail(),
        WindowKind.REDUCE: lambda a, b: {"k": a["k"], "ts": b["ts"], "v": a["v"] + b["v"]},
        WindowKind.PROCESS: CountElements(),
    }[kind]
    spec = WindowSpec(
        assigner=EventTimeSessionWindows.with_gap(300)
        if session
        else TumblingEventTimeWindows.of(500),
        kind=kind,
        timestamp_assigner=lambda e: e["ts"],
        function=function,
        allowed_lateness=lateness,
        late_tag=LATE,
    )
    op = open_window_operator(spec, lambda e: e["k"], backend or window_backend(tmp, "w"))
    op.side_output = []
    return op


class CountElements:
    """A process window function over the elements (the PROCESS kind's function)."""

    def open(self, ctx: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def process(self, key: Any, context: Any, elements: Any, out: Any) -> None:
        w = context.window
        out.collect((key, w.start, w.end, sorted(e["v"] for e in elements)))


def _stream(seed: int) -> list[tuple[list[dict[str, Any]], int]]:
    """Batches of out-of-order records over 6 keys, each with the watermark after it."""
    rng = random.Random(seed)
    steps = []
    now = 0
    for _ in range(60):
        batch = []
        for _ in range(rng.randint(0, 40)):
            lag = rng.choice([0, 0, 0, 50, 200, 900, 3_000])  # some late, some very late
            batch.append({"k": f"k{rng.randint(0, 5)}", "ts": max(0, now - lag), "v": 1})
            now += rng.randint(0, 40)
        if batch and rng.random() < 0.1:
            batch[rng.randrange(len(batch))]["bad"] = True
        steps.append((batch, now - 400))
    return steps


def _run(op: Any, steps: list[tuple[list[dict[str, Any]], int]], end: bool = True) -> list[Any]:
    """Feed ``steps``, then the end of input; a failing record is dropped, the batch goes on."""
    trace: list[Any] = []
    for batch, watermark in steps:
        rest = batch
        while True:
            try:
                out = op.process_batch(rest)
                trace.append(("out", out))
                break
            except RecordFailed as failed:
                trace.append(("failed", failed.index, failed.out))
                rest = rest[failed.index + 1 :]
        trace.append(("late", list(op.side_output)))
        op.side_output.clear()
        trace.append(("fired", op.process_watermark(watermark)))
        trace.append(("state", _state(op)))
    if end:
        trace.append(("end", op.process_watermark(1 << 40), _state(op)))
    return trace


def _state(op: Any) -> Any:
    backend = op.backend
    if isinstance(op, SessionWindowOperator):
        op.prepare_snapshot_pre_barrier(0)  # held sessions into keyed state, as a snapshot does
        keys = sorted(backend.keys(SESSIONS))
        return [(k, op.open_sessions(k)) for k in keys], op.timer_service.pending()
    return _windows(op), op.timer_service.pending()


def _windows(op: Any) -> list[tuple[Any, list[Any]]]:
    """Each key's open windows: the map state's, overlaid with the tumbling path's buffer.

    A process window in the map state is its list, then its appended chunks in
    order, then (tumbling) the elements buffered since it was written.
    """
    backend = op.backend
    windows: dict[Any, dict[Any, Any]] = {}
    for k in backend.keys(WINDOW_CONTENTS):
        backend.key_context.key = k
        windows[k] = dict(op._contents.items())
    appends = getattr(op, "_appends", None)
    if appends is not None:
        for k in backend.keys(WINDOW_APPENDS):
            backend.key_context.key = k
            for (start, end, _n), chunk in sorted(appends.items()):
                windows[k][start, end] = [*windows[k][start, end], *chunk]
    if op._tumbling is not None:
        size = op._tumbling[0]
        for (k, start), value in op._buffer.items():
            w, window = windows.setdefault(k, {}), (start, start + size)
            appended = appends is not None and (k, start) in op._stored
            # a copy: a buffered list grows in place with the next batches
            w[window] = [*w[window], *value] if appended else copy.copy(value)
    return [(k, sorted(w.items())) for k, w in sorted(windows.items()) if w]


@pytest.mark.parametrize("kind", list(WindowKind))
@pytest.mark.parametrize("lateness", [0, 700])
@pytest.mark.parametrize("session", [False, True], ids=["tumbling", "session"])
def test_inlined_path_gives_the_general_paths_results(
    tmp_path: Path, kind: WindowKind, lateness: int, session: bool
) -> None:
    for seed in range(3):
        steps = _stream(seed)
        fast = _operator(tmp_path / f"f{seed}", session=session, kind=kind, lateness=lateness)
        general = _operator(tmp_path / f"g{seed}", session=session, kind=kind, lateness=lateness)
        if session:
            general._gap = 0  # every record through ``_add``
        else:
            general._tumbling = None  # every record through ``_add_batch``
        got, want = _run(fast, steps), _run(general, steps)
        assert got == want
        assert any(t[0] == "late" and t[1] for t in want)  # the stream has late records
        fast.backend.close()
        general.backend.close()


@pytest.mark.parametrize("lateness", [0, 700])
def test_sessions_at_the_watermark_boundary_take_the_general_paths_way(
    tmp_path: Path, lateness: int
) -> None:
    # a session ending exactly at the watermark (max_timestamp == watermark) is due: a new
    # one fires at once (late firing) or is late; one a tick later waits for its timer
    steps: list[tuple[list[dict[str, Any]], int]] = [([{"k": "old", "ts": 0, "v": 1}], 10_000)]
    for i, lag in enumerate((300, 299, 298, 1_000, 999, 998)):
        steps.append(([{"k": f"k{i}", "ts": 10_000 - lag, "v": 1}], 10_000))  # gap 300
        steps.append(([{"k": f"k{i}", "ts": 10_000 - lag + 1, "v": 1}], 10_000))
    steps.append(([], 20_000))
    fast = _operator(tmp_path / "f", session=True, kind=WindowKind.AGGREGATE, lateness=lateness)
    general = _operator(tmp_path / "g", session=True, kind=WindowKind.AGGREGATE, lateness=lateness)
    general._gap = 0
    assert _run(fast, steps) == _run(general, steps)
    fast.backend.close()
    general.backend.close()
