"""Watermarks: strategies, per-split minimum, idleness, the per-channel valve, and a job.

Time is a ManualClock (or a counter standing in for ``monotonic``): no sleeping.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.jobspec.watermarks import MIN_WATERMARK
from aiostream_ckpt.time import TumblingEventTimeWindows, WatermarkStrategy
from aiostream_ckpt.time.valve import WatermarkValve
from aiostream_ckpt.time.watermarks import SourceWatermarks, WatermarkUpdate
from tests.helpers import ScriptedSource, wait_until
from tests.unit.time.support import SplitSource, SpySink, config, drained, start, strategy


class _Now:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _PlainReader:
    """A reader that cannot tell splits apart."""

    def __init__(self, batches: list[list[Any]]) -> None:
        self._batches = batches

    async def read_batch(self, max_records: int) -> list[Any] | None:
        return self._batches.pop(0) if self._batches else None


class _Splits:
    """A split-aware reader the test scripts call by call."""

    def __init__(self, active: list[str]) -> None:
        self.active = active
        self.next: list[tuple[str, list[Any]]] | None = []

    async def read_split_batches(self, max_records: int) -> list[tuple[str, list[Any]]] | None:
        return self.next

    async def read_batch(self, max_records: int) -> list[Any] | None:
        raise AssertionError("event time must read per split")

    def active_splits(self) -> list[str]:
        return self.active


def _ev(ts: int) -> dict[str, int]:
    return {"ts": ts}


async def test_bounded_out_of_orderness_and_monotonous() -> None:
    now = _Now()
    bounded = SourceWatermarks(strategy(max_delay=100), _PlainReader([[_ev(500), _ev(450)]]), now)  # type: ignore[arg-type]
    assert await bounded.read_batch(10) == [_ev(500), _ev(450)]
    assert bounded.poll() == WatermarkUpdate(watermark=500 - 100 - 1)
    assert bounded.poll() is None  # nothing new: nothing to send
    mono = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(lambda e: e["ts"])
    m = SourceWatermarks(mono, _PlainReader([[_ev(7)]]), now)  # type: ignore[arg-type]
    await m.read_batch(10)
    assert m.poll() == WatermarkUpdate(watermark=6)


async def test_records_the_assigner_fails_on_go_to_record_failed_and_are_left_out() -> None:
    """A raising assigner, or one giving no number, fails that record only (dead-lettered)."""

    def ts(e: dict[str, Any]) -> Any:
        if e.get("bad"):
            raise KeyError("ts")
        return e.get("ts")

    s = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(ts)
    batches = [[_ev(5), {"bad": 1}, {"ts": None}, _ev(9), _ev(7)], [{"bad": 2}], [_ev(11)]]
    w = SourceWatermarks(s, _PlainReader(batches), _Now())  # type: ignore[arg-type]
    failed: list[tuple[str, Any, str]] = []
    w.record_failed = lambda fn, rec, exc: failed.append((fn, rec, f"{type(exc).__name__}: {exc}"))
    assert await w.read_batch(10) == [_ev(5), _ev(9), _ev(7)]
    assert w.poll() == WatermarkUpdate(watermark=8)
    assert await w.read_batch(10) == []  # all failed: no timestamp, nothing to send
    assert w.poll() is None
    assert await w.read_batch(10) == [_ev(11)]
    assert w.poll() == WatermarkUpdate(watermark=10)
    name = f"timestamp assigner {ts.__qualname__}"
    assert failed == [
        (name, {"bad": 1}, "KeyError: 'ts'"),
        (name, {"ts": None}, "TypeError: the timestamp is None, not milliseconds (an int)"),
        (name, {"bad": 2}, "KeyError: 'ts'"),
    ]
    # unbound (no task): the assigner's error as it was
    plain = SourceWatermarks(s, _PlainReader([[{"bad": 3}]]), _Now())  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        await plain.read_batch(10)


def test_strategy_needs_a_timestamp_assigner() -> None:
    with pytest.raises(ConfigError, match="timestamp assigner"):
        StreamEnvironment("x").from_source(
            ScriptedSource("s"), watermark_strategy=WatermarkStrategy.for_monotonous_timestamps()
        )
    with pytest.raises(ConfigError):
        WatermarkStrategy.for_bounded_out_of_orderness(-1)


async def test_source_watermark_is_min_over_active_splits() -> None:
    now = _Now()
    reader = _Splits(["p0", "p1"])
    sw = SourceWatermarks(strategy(), reader, now)  # type: ignore[arg-type]
    reader.next = [("p0", [_ev(1000)]), ("p1", [_ev(200)])]
    assert await sw.read_batch(10) == [_ev(1000), _ev(200)]
    assert sw.poll() == WatermarkUpdate(watermark=199)
    reader.next = [("p0", [_ev(2000)])]
    await sw.read_batch(10)
    assert sw.poll() is None, "p1 still holds the watermark at 199"
    reader.active = ["p0"]  # p1 finished: it no longer holds anything back
    assert sw.poll() == WatermarkUpdate(watermark=1999)


async def test_idle_split_is_excluded_after_the_timeout() -> None:
    now = _Now()
    reader = _Splits(["p0", "p1"])
    sw = SourceWatermarks(strategy(idle_ms=5000), reader, now)  # type: ignore[arg-type]
    reader.next = [("p0", [_ev(1000)])]
    await sw.read_batch(10)
    assert sw.poll() is None, "p1 has sent nothing: it holds the watermark at the minimum"
    now.t = 4.0
    reader.next = [("p0", [_ev(3000)])]
    await sw.read_batch(10)
    assert sw.poll() is None
    now.t = 5.0  # p1 silent for 5 s: left out
    assert sw.poll() == WatermarkUpdate(watermark=2999)
    now.t = 9.0  # p0 silent for 5 s too: the whole instance is idle
    assert sw.poll() == WatermarkUpdate(idle=True)
    assert sw.poll() is None
    reader.next = [("p0", [_ev(4000)])]
    await sw.read_batch(10)
    assert sw.poll() == WatermarkUpdate(idle=False, watermark=3999)
    reader.next = [("p1", [_ev(100)])]  # p1 wakes up behind: holds further progress
    await sw.read_batch(10)
    reader.next = [("p0", [_ev(9000)])]
    await sw.read_batch(10)
    assert sw.poll() is None
    assert sw.watermark == 3999, "a watermark never goes backwards"


async def test_reader_without_splits_goes_idle() -> None:
    sw = SourceWatermarks(strategy(), _Splits([]), _Now())  # type: ignore[arg-type]
    assert sw.poll() == WatermarkUpdate(idle=True)
    assert sw.poll() is None


async def test_reader_whose_splits_finished_does_not_go_idle() -> None:
    """End of input (a watermark at the maximum) follows; idleness now would make late data."""
    reader = _Splits(["f"])
    sw = SourceWatermarks(strategy(idle_ms=1), reader, _Now())  # type: ignore[arg-type]
    reader.next = [("f", [_ev(100)])]
    await sw.read_batch(10)
    assert sw.poll() == WatermarkUpdate(watermark=99)
    reader.active = []
    assert sw.poll() is None
    assert not sw.idle


def test_valve_min_over_channels_never_backwards() -> None:
    v = WatermarkValve(3)
    assert v.on_watermark(0, 100) is None
    assert v.on_watermark(1, 50) is None
    assert v.on_watermark(2, 70) == WatermarkUpdate(watermark=50)
    assert v.on_watermark(1, 40) is None, "a channel's watermark never goes back"
    assert v.on_watermark(1, 90) == WatermarkUpdate(watermark=70)
    assert v.on_watermark(2, 200) == WatermarkUpdate(watermark=90)
    assert v.on_end(1) == WatermarkUpdate(watermark=100), "an ended channel is left out"
    assert v.watermark == 100


def test_valve_idle_channels() -> None:
    v = WatermarkValve(2)
    v.on_watermark(0, 100)
    assert v.on_status(1, idle=True) == WatermarkUpdate(watermark=100)
    assert v.on_status(0, idle=True) == WatermarkUpdate(idle=True)
    assert v.on_status(0, idle=False) == WatermarkUpdate(idle=False)
    # channel 1 returns behind the output: the output stays until it catches up
    assert v.on_watermark(1, 20) is None
    assert v.watermark == 100
    assert v.on_watermark(0, 300) is None
    assert v.on_watermark(1, 250) == WatermarkUpdate(watermark=250)
    assert v.watermark >= 100 > MIN_WATERMARK


def _count_job(env: StreamEnvironment, stream: Any, sink: SpySink) -> None:
    (
        stream.key_by(lambda e: e["k"])
        .window(TumblingEventTimeWindows.of(10_000))
        .reduce(lambda a, b: {**a, "n": a.get("n", 1) + 1}, uid="win")
        .sink_to(sink, uid="spy")
    )


async def test_idle_split_does_not_stall_the_job(tmp_path: Path) -> None:
    clock = ManualClock()
    env = StreamEnvironment("idle", config=config(tmp_path))
    src = SplitSource("src", ["p0", "p1"])
    spy = SpySink()
    events = env.from_source(src, uid="src", watermark_strategy=strategy(idle_ms=30_000))
    _count_job(env, events, spy)
    job, run, _ = await start(env, clock)
    head = run.tasks[0]
    src.feed("p0", [{"k": "a", "ts": 1_000}])
    await wait_until(lambda: head.metrics.records_in == 1)  # p1's idle clock starts at 0
    clock.advance(20.0)
    src.feed("p0", [{"k": "a", "ts": 25_000}])
    await wait_until(lambda: head.metrics.records_in == 2)
    await drained(run)  # the source looked at the clock (20 s) after the last record
    assert spy.records == [], "p1 has sent nothing: event time must not move yet"
    clock.advance(10.0)  # p1 silent for 30 s; p0 was active 10 s ago
    await wait_until(lambda: len(spy.records) == 1)
    assert spy.records == [{"k": "a", "ts": 1_000}], "window [0, 10 s) fired once p1 went idle"
    src.end()
    await asyncio.wait_for(job, 30)
    assert spy.records[1:] == [{"k": "a", "ts": 25_000}]


async def test_task_watermark_is_min_over_its_inputs(tmp_path: Path) -> None:
    env = StreamEnvironment("minwm", config=config(tmp_path))
    fast, slow = SplitSource("fast", ["f"]), SplitSource("slow", ["s"])
    spy = SpySink()
    a = env.from_source(fast, uid="fast", watermark_strategy=strategy())
    b = env.from_source(slow, uid="slow", watermark_strategy=strategy())
    _count_job(env, a.union(b), spy)
    job, run, _ = await start(env)
    fast.feed("f", [{"k": "x", "ts": 1_000}, {"k": "x", "ts": 50_000}])
    slow.feed("s", [{"k": "y", "ts": 2_000}])
    win = next(t for t in run.tasks if t.task_id.startswith("win"))
    await wait_until(lambda: win.metrics.records_in == 3)
    await drained(run)
    assert spy.records == [], "the slow input is at 2 s: window [0, 10 s) must wait"
    slow.feed("s", [{"k": "y", "ts": 60_000}])
    await wait_until(lambda: len(spy.records) == 2)
    assert sorted(r["k"] for r in spy.records) == ["x", "y"]
    fast.end()
    slow.end()
    await asyncio.wait_for(job, 30)


async def test_source_watermarks_restore_splits_and_idleness() -> None:
    """After a restore an idle split stays idle and a slow one still holds the minimum."""
    now = _Now()
    reader = _Splits(["p0", "p1", "p2"])
    sw = SourceWatermarks(strategy(idle_ms=5000), reader, now)  # type: ignore[arg-type]
    reader.next = [("p0", [_ev(1000)]), ("p1", [_ev(300)]), ("p2", [_ev(50)])]
    await sw.read_batch(10)
    assert sw.poll() == WatermarkUpdate(watermark=49)
    now.t = 4.0
    reader.next = [("p0", [_ev(2000)]), ("p1", [_ev(400)])]
    await sw.read_batch(10)
    now.t = 6.0  # p2 silent for 6 s: idle
    assert sw.poll() == WatermarkUpdate(watermark=399)
    snap = sw.snapshot()
    # [newest timestamp the watermark uses, idle, records of the chunk in progress, its newest]
    assert snap["splits"] == {
        "p0": [2000, False, 2, 2000],
        "p1": [400, False, 2, 400],
        "p2": [50, True, 1, 50],
    }

    later = _Now()
    later.t = 100.0  # another process: its monotonic clock has nothing to do with the old one
    again = SourceWatermarks(strategy(idle_ms=5000), _Splits(["p0", "p1", "p2"]), later)  # type: ignore[arg-type]
    again.restore(snap)
    assert (again.watermark, again.idle) == (399, False)
    assert again.current() == 399, "p2 is still idle and p1 still holds event time"
    assert again.poll() is None


def test_valve_restores_channels_only_for_the_same_layout() -> None:
    v = WatermarkValve(3)
    v.on_watermark(0, 10)
    v.on_watermark(1, 20)
    v.on_status(2, idle=True)
    snap = v.snapshot()
    assert snap == {
        "watermark": 10,
        "idle": False,
        "channels": [[10, False], [20, False], [MIN_WATERMARK, True]],
    }
    same = WatermarkValve(3)
    same.restore(snap, channels=True)
    assert same.on_watermark(0, 15) == WatermarkUpdate(watermark=15), "channel 2 idle, 1 at 20"
    other = WatermarkValve(3)
    other.restore(snap, channels=False)
    assert other.watermark == 10
    assert other.on_watermark(0, 15) is None, "unknown channels start at the minimum"
    assert other.on_watermark(0, 5) is None, "and the task's watermark never goes back"


def test_rescaled_restore_takes_the_minimum() -> None:
    from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
    from aiostream_ckpt.time.checkpointed import restored_time

    def time(wm: int, idle: bool) -> dict[str, Any]:
        return {
            "watermark": wm,
            "idle": idle,
            "layout": ["src/2/hash"],
            "channels": [[wm, idle]] * 2,
        }

    restored = CompletedCheckpoint(
        checkpoint_id=3, is_savepoint=False, job_name="j", trigger_time=0, completion_time=0,
        duration_seconds=0, max_parallelism=128, tasks={}, size_bytes=0,
        directory=Path("."), root=Path("."),
        operators={"win": {"parallelism": 2, "subtasks": {
            "0": {"keyed": None, "operator": None, "time": time(500, True)},
            "1": {"keyed": None, "operator": None, "time": time(300, False)},
        }}},
    )  # fmt: skip
    own = restored_time(restored, [None, "win"], subtask=1, parallelism=2)
    assert own == time(300, False)
    assert restored_time(restored, ["win"], subtask=0, parallelism=3) == time(300, False)
    assert restored_time(restored, ["other"], subtask=0, parallelism=2) is None


class _Fetched:
    """One bounded split read in fetches of the sizes given (as a Kafka partition may be)."""

    def __init__(self, records: list[Any], sizes: list[int], *, tail: bool = False) -> None:
        self.records = records
        self.pos = 0
        self._sizes = list(sizes)
        self._tail = tail  # unbounded, at its live tail: nothing more to read after a fetch

    async def read_split_batches(self, max_records: int) -> list[tuple[str, list[Any]]] | None:
        if self.pos >= len(self.records):
            return [] if self._tail else None
        n = min(self._sizes.pop(0) if self._sizes else max_records, max_records)
        out = self.records[self.pos : self.pos + n]
        self.pos += len(out)
        return [("p0", out)]

    async def read_batch(self, max_records: int) -> list[Any] | None:
        raise AssertionError("event time must read per split")

    def active_splits(self) -> list[str]:
        return ["p0"] if self._tail or self.pos < len(self.records) else []

    async def has_backlog(self, split: str) -> bool:
        return not self._tail and self.pos < len(self.records)


def _shuffled_events(n: int) -> list[dict[str, int]]:
    """Out-of-order timestamps: some records come after the watermark passed them."""
    import random

    rng = random.Random(5)
    return [{"i": i, "ts": i * 10 + rng.randrange(-400, 40)} for i in range(n)]


async def _met(sw: SourceWatermarks, chunk: int) -> list[tuple[int, int]]:
    """(record, the watermark sent before it) as the source task sends them downstream."""
    out: list[tuple[int, int]] = []
    sent = MIN_WATERMARK
    while (segments := await sw.read_segments(chunk)) is not None:
        for records, update in segments:
            out += [(r["i"], sent) for r in records]
            if update is not None and update.watermark is not None:
                sent = update.watermark
        update = sw.poll()  # what the task sends after the read
        if update is not None and update.watermark is not None:
            sent = update.watermark
    return out


@pytest.mark.parametrize(
    "sizes",
    [[64] * 40, [1] * 300 + [64] * 40, [7, 100, 3, 64, 64, 1, 50, 33] * 40, [13] * 200],
    ids=["whole-chunks", "ones-then-chunks", "mixed", "thirteens"],
)
async def test_event_time_moves_at_the_same_records_whatever_the_fetch_sizes(
    sizes: list[int],
) -> None:
    """A loaded machine fetches Kafka in other sizes than the reference run did.

    Was: the watermark moved after every read, so which records met which
    watermark (late or not) depended on the fetch sizes, and a kill -9 proof
    of a windowed app from Kafka saw 'lost' records on a loaded machine.
    """
    events = _shuffled_events(1000)
    now = _Now()
    reference = await _met(
        SourceWatermarks(strategy(max_delay=100), _Fetched(events, [64] * 40), now, 64),  # type: ignore[arg-type]
        64,
    )
    got = await _met(
        SourceWatermarks(strategy(max_delay=100), _Fetched(events, sizes), now, 64),  # type: ignore[arg-type]
        64,
    )
    assert got == reference
    late = sum(1 for i, wm in reference if events[i]["ts"] <= wm)
    assert late > 10, "the input must have late records for this to test anything"


async def test_a_restore_mid_chunk_moves_event_time_at_the_same_records() -> None:
    events = _shuffled_events(500)
    now = _Now()
    whole = await _met(
        SourceWatermarks(strategy(max_delay=100), _Fetched(events, [64] * 20), now, 64),  # type: ignore[arg-type]
        64,
    )
    first = _Fetched(events, [20, 45, 30, 55])  # killed after these four reads
    sw = SourceWatermarks(strategy(max_delay=100), first, now, 64)  # type: ignore[arg-type]
    sent = MIN_WATERMARK
    met: list[tuple[int, int]] = []
    for _ in range(4):  # 150 records, then a checkpoint in the middle of the third chunk
        segments = await sw.read_segments(64)
        assert segments is not None
        for records, update in segments:
            met += [(r["i"], sent) for r in records]
            if update is not None and update.watermark is not None:
                sent = update.watermark
        update = sw.poll()
        if update is not None and update.watermark is not None:
            sent = update.watermark
    snap = sw.snapshot()
    assert snap["splits"]["p0"][2] == 150 - 128, "22 records of the third chunk so far"
    again = SourceWatermarks(strategy(max_delay=100), _Fetched(events[150:], [9, 64]), now, 64)  # type: ignore[arg-type]
    again.restore(snap)
    rest = await _met(again, 64)
    rest = [(i, wm if wm != MIN_WATERMARK else sent) for i, wm in rest]
    assert met + rest == whole


async def test_a_live_tail_moves_event_time_at_once() -> None:
    """Caught up (nothing more to read now), a partial chunk moves the watermark: no wait."""
    now = _Now()
    reader = _Fetched([_ev(5_000), _ev(6_000)], [2], tail=True)
    sw = SourceWatermarks(strategy(max_delay=100), reader, now, 64)  # type: ignore[arg-type]
    segments = await sw.read_segments(64)
    assert segments is not None and [r for s, _ in segments for r in s] == [_ev(5_000), _ev(6_000)]
    assert sw.poll() == WatermarkUpdate(watermark=6_000 - 100 - 1)


async def test_a_backlog_holds_a_partial_chunk_until_it_completes() -> None:
    now = _Now()
    reader = _Fetched([_ev(t) for t in range(1_000, 1_004)], [2, 2])
    sw = SourceWatermarks(strategy(max_delay=0), reader, now, 4)  # type: ignore[arg-type]
    assert await sw.read_segments(4) == [([_ev(1_000), _ev(1_001)], None)]
    assert sw.poll() is None, "two more records of the chunk wait: event time waits for them"
    segments = await sw.read_segments(4)
    assert segments == [([_ev(1_002), _ev(1_003)], WatermarkUpdate(watermark=1_002)), ([], None)]
