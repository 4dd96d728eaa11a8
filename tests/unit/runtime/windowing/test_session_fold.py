"""Session windows' C loops do what their Python twins do, object for object."""

from __future__ import annotations

import contextlib
import copy
import gc
import random
import tracemalloc
from operator import itemgetter
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.jobspec.graph import WindowKind, WindowSpec
from aiostream_ckpt.jobspec.window_functions import AggregateFunction
from aiostream_ckpt.runtime.windowing import session_fold, session_timers, session_windows
from aiostream_ckpt.runtime.windowing.session_fold import fold_py, rearm_py
from aiostream_ckpt.time import CountAggregate, EventTimeSessionWindows, OutputTag
from tests.unit.time.support import open_window_operator, window_backend

if session_fold.NATIVE:
    from aiostream_ckpt.runtime.windowing._session_speedups import fold as fold_c
    from aiostream_ckpt.runtime.windowing._session_speedups import rearm as rearm_c

pytestmark = pytest.mark.skipif(
    not session_fold.NATIVE, reason="the C loops are not built (or AIOSTREAM_NO_EXTENSIONS)"
)

GAP = 100
BIG = 1 << 70  # past the C loops' 62 bits: theirs to hand back


class Boom(Exception):
    pass


def _timestamp(rng: random.Random, edges: list[Any]) -> Any:
    """Mostly ints, often at a session's edge (``end``, ``start - GAP``); a few odd ones."""
    odd = [float(rng.randrange(2_000)), True, BIG + rng.randrange(9)]
    return rng.choice([rng.randrange(0, 2_000)] * 5 + [rng.choice(edges or [0])] * 4 + odd)


def _held(rng: random.Random, keys: list[str]) -> dict[Any, list[Any]]:
    held: dict[Any, list[Any]] = {}
    for k in keys:
        shape = rng.randrange(10)
        if shape == 0:
            continue  # not held: the operator reads it
        start = rng.randrange(0, 2_000)
        end = start + rng.randrange(1, 300)
        acc: Any = rng.choice([rng.randrange(50)] * 5 + [2.5, BIG])
        if shape == 1:
            held[k] = []
        elif shape == 2:
            held[k] = [(start, end, acc), (end + 500, end + 600, 1)]
        elif shape == 3:
            held[k] = [(float(start), end, acc)]
        elif shape == 4:
            held[k] = [(start, BIG, acc)]
        else:
            held[k] = [(start, end, acc)]
    return held


def _counting_add(fail_at: Any) -> Any:
    def add(rec: dict[str, Any], acc: Any) -> Any:
        if rec is fail_at:
            raise Boom(rec["k"])
        return (acc, rec["ts"]) if isinstance(acc, tuple) else acc + 1 if acc != "x" else "x!"

    return add


def _exotic(held: dict[Any, list[Any]]) -> Any:
    """Whether an item or its key's held sessions have a number the C loops hand back."""

    def odd(v: Any) -> bool:
        return v.__class__ is not int or not -(1 << 61) <= v <= 1 << 61

    def exotic(item: Any, field: Any = "k") -> bool:
        item = item if isinstance(item, dict) else {"ts": item[0], "key": item[1]}
        sessions = held.get(item[field]) or []
        numbers = [n for s in sessions[:1] for n in s if isinstance(n, int | float)]
        return any(odd(v) for v in (item["ts"], *numbers))

    return exotic


def _drive(native: bool, loop: Any, twin: Any, seq: list[Any], start: int, args: tuple[Any, ...],
           exotic: Any) -> list[int]:  # fmt: skip
    """Run ``loop`` over ``seq`` as the operator does; return the indexes it leaves to it.

    The C loop may hand back what Python's twin would still do, but only for an
    ``exotic`` item (a number past 62 bits or not an int, in it or its key's
    state): there the twin goes on, as the operator's Python would. What
    neither does is the operator's (listed, skipped here).
    """
    theirs: list[int] = []
    i = start
    while True:
        i = loop(seq, i, *args)
        if native and i < len(seq):
            odd = exotic(seq[i])  # before the twin changes its key's state
            j = twin(seq, i, *args)
            if j > i:
                assert odd, f"C handed back {seq[i]}, which Python does"
                i = j
                continue
        if i >= len(seq):
            return theirs
        theirs.append(i)
        i += 1


def _run_fold(native: bool, case: tuple[Any, ...]) -> tuple[Any, ...]:
    batch, start, held, add, after = copy.deepcopy(case)
    if add == "fail":
        add = _counting_add(batch[len(batch) // 2] if batch else None)
    elif add == "plain":
        add = _counting_add(None)
    added: list[Any] = []
    failed: list[int] = []
    args = (held, itemgetter("k"), itemgetter("ts"), add, GAP, after, added, failed)
    try:
        loop = fold_c if native else fold_py
        exotic = _exotic(held) if after != BIG else lambda item: True
        got: Any = _drive(native, loop, fold_py, batch, start, args, exotic)
    except Boom as exc:
        got = ("raised", str(exc))
    return got, held, added, failed


@pytest.mark.parametrize("seed", range(300))
def test_fold_in_c_matches_python(seed: int) -> None:
    rng = random.Random(seed)
    keys = [f"k{i}" for i in range(rng.randrange(1, 8))]
    held = _held(rng, keys)
    edges = [e for v in held.values() for s in v for e in (s[1], s[1] + 1, s[0] - GAP, s[0] - 101)]
    n = rng.randrange(0, 40)
    batch = [{"k": rng.choice(keys), "ts": _timestamp(rng, edges)} for _ in range(n)]
    # the watermark (after) often at a session's end, where "due" turns
    ends = [s[1] + d for v in held.values() for s in v[:1] for d in (-1, 0, 1)]
    after = rng.choice([-(1 << 40), BIG, rng.randrange(0, 2_000), *ends])
    case = (batch, rng.randrange(0, 3), held, rng.choice([None, "plain", "fail"]), after)
    # the same outcome, the same records left to the operator (copies: other objects)
    assert _run_fold(True, case) == _run_fold(False, case)


def test_fold_keeps_going_after_a_handed_back_record() -> None:
    held: dict[Any, list[Any]] = {"a": [(0, 100, 0)], "b": [(0, 100, 0)]}
    batch = [{"k": "a", "ts": 10}, {"k": "b", "ts": 10.5}, {"k": "a", "ts": 20}]
    for fn in (fold_c, fold_py):
        h = copy.deepcopy(held)
        added: list[Any] = []
        assert fn(batch, 0, h, itemgetter("k"), itemgetter("ts"), None, GAP, 0, added, []) == 1
        assert fn(batch, 2, h, itemgetter("k"), itemgetter("ts"), None, GAP, 0, added, []) == 3
        assert h == {"a": [(0, 120, 2)], "b": [(0, 100, 0)]} and added == [1, 2]


def _rearm_case(rng: random.Random) -> tuple[Any, ...]:
    keys = [f"k{i}" for i in range(rng.randrange(1, 10))]
    watermark = rng.randrange(1_000, 3_000)
    bits = rng.choice([4, 6, 10])
    armed: dict[Any, Any] = {}
    held: dict[Any, list[Any]] = {}
    run: list[tuple[Any, Any]] = []
    for _ in range(rng.randrange(0, 30)):
        k = rng.choice(keys)
        ts = rng.choice([rng.randrange(0, watermark + 1)] * 6 + [float(watermark - 1), BIG])
        run.append((ts, k))
        if rng.random() < 0.7:
            armed[k] = ts if rng.random() < 0.8 else ts + 1
    for k in keys:
        shape = rng.randrange(6)
        end = rng.choice([rng.randrange(0, watermark * 2), watermark, watermark + 1, watermark + 2])
        if shape == 0:
            continue
        held[k] = (
            [(0, end, 1)]
            if shape < 4
            else [(0, end, 1), (end, end + 9, 1)]
            if shape == 4
            else [(0, BIG, 1)]
        )
    buckets = {n: [] for n in range((watermark * 2) >> bits) if rng.random() < 0.7}
    return run, rng.randrange(0, 3), armed, held, buckets, watermark, bits


def _run_rearm(native: bool, case: tuple[Any, ...]) -> tuple[Any, ...]:
    run, start, armed, held, buckets, watermark, bits = copy.deepcopy(case)
    args = (armed, held, buckets, watermark, bits)
    loop = rearm_c if native else rearm_py
    by_held = _exotic(held)

    def exotic(entry: tuple[Any, Any]) -> bool:  # or its key's armed time
        return by_held(entry, "key") or by_held((armed.get(entry[1], 0), entry[1]), "key")

    theirs = _drive(native, loop, rearm_py, run, start, args, exotic)
    return theirs, run, armed, held, buckets


@pytest.mark.parametrize("seed", range(300))
def test_rearm_in_c_matches_python(seed: int) -> None:
    case = _rearm_case(random.Random(seed))
    assert _run_rearm(True, case) == _run_rearm(False, case)


def test_the_c_loops_leak_no_memory() -> None:
    """Run each loop 300 times on fresh containers: the traced memory stays where it was."""
    rng = random.Random(7)
    fold_case = ([{"k": f"k{i % 50}", "ts": i} for i in range(2_000)], 0, None, None, 0)
    rearm_case = _rearm_case(rng)

    def once() -> None:
        held = {f"k{i}": [(0, 50, 0)] for i in range(50)}
        batch = fold_case[0]
        added: list[Any] = []
        assert fold_c(batch, 0, held, itemgetter("k"), itemgetter("ts"), None, GAP, 0, added, [])
        with contextlib.suppress(Boom):
            fold_c(batch, 0, held, itemgetter("k"), itemgetter("ts"), _counting_add(batch[5]),
                   GAP, 0, added, [])  # fmt: skip
        run, start, armed, h, buckets, watermark, bits = copy.deepcopy(rearm_case)
        rearm_c(run, start, armed, h, buckets, watermark, bits)

    for _ in range(50):
        once()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(300):
            once()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert after - before < 20_000, after - before  # a leak of one object per record: MBs


class _Sum(AggregateFunction[dict[str, Any], int, int]):
    """Not the built-in count: fold calls its ``add``."""

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: dict[str, Any], accumulator: int) -> int:
        return accumulator + value["n"]

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, a: int, b: int) -> int:
        return a + b


def _operator_run(tmp: Path, seed: int, function: Any, lateness: int) -> list[Any]:
    rng = random.Random(seed)
    backend = window_backend(tmp, "sessions")
    spec = WindowSpec(
        assigner=EventTimeSessionWindows.with_gap(1_000),
        kind=WindowKind.AGGREGATE,
        timestamp_assigner=itemgetter("ts"),
        function=function,
        allowed_lateness=lateness,
        late_tag=OutputTag("late"),
    )
    op = open_window_operator(spec, itemgetter("user"), backend)
    op.side_output = []
    out: list[Any] = []
    now = 0
    for batch_no in range(150):
        batch = []
        for _ in range(rng.randrange(0, 60)):
            now += rng.randrange(0, 40)
            # out of order by up to 2 s; now and then very late (behind the watermark)
            back = rng.randrange(0, 2_000) if rng.random() < 0.9 else rng.randrange(0, 9_000)
            user = f"u{rng.randrange(25)}"
            batch.append({"user": user, "ts": now - back, "n": rng.randrange(1, 4)})
        out += op.process_batch(batch)
        op.end_batch()
        out += op.process_watermark(now - 2_001)
        op.end_batch()
        if batch_no % 40 == 39:
            op.prepare_snapshot_pre_barrier(batch_no)
    out += op.process_watermark(1 << 62)
    backend.close()
    return [out, op.side_output]


@pytest.mark.parametrize("lateness", [0, 700])
@pytest.mark.parametrize("function", [CountAggregate(), _Sum()], ids=["count", "sum"])
@pytest.mark.parametrize("seed", range(3))
def test_the_operator_fires_the_same_with_the_c_loops_as_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, function: Any, lateness: int
) -> None:
    native = _operator_run(tmp_path / "c", seed, function, lateness)
    monkeypatch.setattr(session_windows, "fold", fold_py)
    monkeypatch.setattr(session_timers, "rearm", rearm_py)
    python = _operator_run(tmp_path / "py", seed, function, lateness)
    assert native == python
    assert len(native[0]) > 100 and native[1]  # sessions fired, late records seen
