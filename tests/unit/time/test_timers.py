"""Keyed timers: fire in time order, can be deleted, processing time on a ManualClock,
and both kinds survive a restore from a checkpoint."""

from __future__ import annotations

import asyncio
import datetime
import enum
import re
from pathlib import Path

import pytest

from aiostream_ckpt.api import KeyedProcessFunction, StreamEnvironment
from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.connectors.collection import CollectionSource
from aiostream_ckpt.jobspec.config import RestartConfig
from aiostream_ckpt.state.codecs import StateTypeError
from aiostream_ckpt.time import TimeDomain
from aiostream_ckpt.time.timers import InternalTimerService, ProcessingTimeScheduler
from tests.helpers import wait_until
from tests.unit.state.test_key_types import CHANGING_KEYS, Shade
from tests.unit.time.support import (
    SplitSource,
    SpySink,
    config,
    drained,
    start,
    strategy,
    window_backend,
)


class EchoTimers(KeyedProcessFunction):
    """Sets an event-time timer at ts + 10 (and deletes it for 'drop' records)."""

    def process_element(self, value, ctx, out):
        ts = ctx.timer_service()
        ts.register_event_time_timer(value["ts"] + 10)
        if value.get("drop"):
            ts.delete_event_time_timer(value["ts"] + 10)
        if value.get("proc"):
            ts.register_processing_time_timer(ts.current_processing_time() + value["proc"])

    def on_timer(self, timestamp, ctx, out):
        wm = ctx.timer_service().current_watermark()
        out.collect((ctx.current_key, timestamp, ctx.time_domain.value, wm))


def test_event_time_timers_fire_in_time_order(tmp_path: Path) -> None:
    env = StreamEnvironment("order", config=config(tmp_path, batch_size=3))
    events = [{"k": k, "ts": ts} for ts, k in [(50, "a"), (20, "b"), (40, "a"), (10, "c")]]
    events += [{"k": "b", "ts": 30, "drop": True}, {"k": "c", "ts": 500}, {"k": "a", "ts": 300}]
    s = env.from_source(CollectionSource(events), watermark_strategy=strategy(max_delay=100))
    out = env.execute_and_collect(s.key_by(lambda e: e["k"]).process(EchoTimers(), uid="t"))
    fired = [(k, ts) for k, ts, domain, _ in out]
    assert [ts for _, ts in fired] == sorted(ts for _, ts in fired)
    assert fired == [("c", 20), ("b", 30), ("a", 50), ("a", 60), ("a", 310), ("c", 510)]
    assert all(domain == "event_time" and wm >= ts for _, ts, domain, wm in out)


def test_timers_need_on_timer(tmp_path: Path) -> None:
    class NoTimer(KeyedProcessFunction):
        def process_element(self, value, ctx, out):
            ctx.timer_service()

    env = StreamEnvironment("no", config=config(tmp_path, restart=RestartConfig(attempts=0)))
    s = env.from_collection([1]).key_by(lambda x: x).process(NoTimer(), uid="p")
    with pytest.raises(Exception, match="on_timer"):
        env.execute_and_collect(s)


async def test_processing_time_timers_on_the_manual_clock(tmp_path: Path) -> None:
    clock = ManualClock()
    env = StreamEnvironment("proc", config=config(tmp_path))
    src, spy = SplitSource("src", ["s"]), SpySink()
    s = env.from_source(src, uid="src", watermark_strategy=strategy())
    s.key_by(lambda e: e["k"]).process(EchoTimers(), uid="t").sink_to(spy, uid="spy")
    job, run, _ = await start(env, clock)
    src.feed("s", [{"k": "a", "ts": 10**12, "proc": 5_000}])
    await wait_until(lambda: run.tasks[0].metrics.records_in == 1)
    await wait_until(lambda: clock.sleepers == 1)  # the timer's wake-up, parked on the clock
    clock.advance(4.9)
    assert clock.sleepers == 1, "at 4.9 s nothing on the clock is due: the 5 s timer waits"
    await drained(run)
    assert spy.records == []
    clock.advance(0.1)
    await wait_until(lambda: len(spy.records) == 1)
    key, ts, domain, _ = spy.records[0]
    assert (key, domain) == ("a", TimeDomain.PROCESSING_TIME.value)
    assert ts == round(clock.time() * 1000)
    src.end()
    await asyncio.wait_for(job, 30)


async def test_timers_survive_restore(tmp_path: Path) -> None:
    """Timers set before checkpoint 1 fire after a restore from it, in order."""

    def build(clock: ManualClock) -> tuple[StreamEnvironment, SplitSource, SpySink]:
        env = StreamEnvironment("restore", config=config(tmp_path))
        src, spy = SplitSource("src", ["s"]), SpySink()
        s = env.from_source(src, uid="src", watermark_strategy=strategy(max_delay=10_000))
        s.key_by(lambda e: e["k"]).process(EchoTimers(), uid="t").sink_to(spy, uid="spy")
        return env, src, spy

    clock = ManualClock()
    env, src, spy = build(clock)
    job, run, runner = await start(env, clock)
    src.feed("s", [{"k": "a", "ts": 1_000, "proc": 60_000}, {"k": "b", "ts": 900}])
    await wait_until(lambda: run.tasks[0].metrics.records_in == 2)
    assert run.coordinator is not None
    await run.coordinator.trigger()
    src.feed("s", [{"k": "c", "ts": 950}])  # after the checkpoint: replayed, not restored
    runner.cancel()
    await asyncio.wait_for(job, 30)
    assert spy.records == [], "nothing was due before the restart"

    env, src, spy = build(clock)
    job, run, _ = await start(env, clock)
    src.feed("s", [{"k": "c", "ts": 950}, {"k": "d", "ts": 50_000}])
    await wait_until(lambda: len(spy.records) == 3)
    assert [(k, ts) for k, ts, _, _ in spy.records] == [("b", 910), ("c", 960), ("a", 1010)]
    clock.advance(60.0)
    await wait_until(lambda: len(spy.records) == 4)
    assert spy.records[3][0] == "a" and spy.records[3][2] == "processing_time"
    src.end()
    await asyncio.wait_for(job, 30)
    assert [(k, ts) for k, ts, _, _ in spy.records[4:]] == [("d", 50_010)]


class KeyTypes(KeyedProcessFunction):
    def process_element(self, value, ctx, out):
        ctx.timer_service().register_event_time_timer(value["ts"] + 10)

    def on_timer(self, timestamp, ctx, out):
        out.collect((ctx.current_key, type(ctx.current_key), timestamp))


@pytest.mark.parametrize(
    "key", [("a", 1), 7, ("x", (1, 2.5), None), True, 1.5, "s"], ids=lambda k: type(k).__name__
)
async def test_timer_keys_keep_their_type_across_a_restore(tmp_path: Path, key: object) -> None:
    def build() -> tuple[StreamEnvironment, SplitSource, SpySink]:
        env = StreamEnvironment("keys", config=config(tmp_path))
        src, spy = SplitSource("src", ["s"]), SpySink()
        s = env.from_source(src, uid="src", watermark_strategy=strategy(max_delay=10_000))
        s.key_by(lambda e: key).process(KeyTypes(), uid="t").sink_to(spy, uid="spy")
        return env, src, spy

    clock = ManualClock()
    env, src, spy = build()
    job, run, runner = await start(env, clock)
    src.feed("s", [{"ts": 1_000}])
    await wait_until(lambda: run.tasks[0].metrics.records_in == 1)
    assert run.coordinator is not None
    await run.coordinator.trigger()
    runner.cancel()
    await asyncio.wait_for(job, 30)

    env, src, spy = build()  # the timer at 1 010 comes from the restored state
    job, run, _ = await start(env, clock)
    src.feed("s", [{"ts": 50_000}])
    src.end()
    await asyncio.wait_for(job, 30)
    assert spy.records == [(key, type(key), 1_010), (key, type(key), 50_010)]


class Color(enum.Enum):
    RED = "red"


@pytest.mark.parametrize(
    ("key", "back"),
    [(Color.RED, "'red' (str)"), (datetime.date(2024, 1, 2), "'2024-01-02' (str)")],
)
def test_a_key_that_would_change_type_is_refused(tmp_path: Path, key: object, back: str) -> None:
    # stored keys are JSON: an enum or a date would be a str in on_timer after a restore
    env = StreamEnvironment("badkey", config=config(tmp_path, restart=RestartConfig(attempts=0)))
    s = env.from_source(CollectionSource([{"ts": 1}]), watermark_strategy=strategy()).key_by(
        lambda e: key
    )
    with pytest.raises(Exception, match=rf"come back as {re.escape(back)}"):
        env.execute_and_collect(s.process(KeyTypes(), uid="t"))


@pytest.mark.parametrize("domain", ["event", "processing"])
@CHANGING_KEYS
def test_a_timer_under_a_key_that_would_change_type_is_refused_and_never_fires(
    tmp_path: Path, domain: str, key_type: object, key: object, why: str
) -> None:
    """The timer's state refused the key at registration, but the timer was queued
    first: it fired in this run (under an error policy that goes on after the record)
    and was gone after a restore. Fails on the code before (pending (1, 0) / (0, 1))."""
    backend = window_backend(tmp_path, "t", key_type=key_type)
    timers = InternalTimerService(backend)
    clock = ManualClock(0)
    timers.bind(ProcessingTimeScheduler(clock, lambda coro, name: coro.close(), _nothing, "t"))
    register = getattr(timers, f"register_{domain}_time_timer")
    backend.key_context.key = key
    with pytest.raises(StateTypeError, match=why):
        register(5)
    assert timers.pending() == (0, 0)
    fired: list[object] = []
    timers.advance_watermark(100, lambda ts, k: fired.append((ts, k)))
    timers.advance_processing_time(100, lambda ts, k: fired.append((ts, k)))
    assert fired == []
    backend.key_context.key = Shade.DARK if key_type is Shade else "dark"
    register(5)  # the right key still goes
    assert sum(timers.pending()) == 1
    backend.close()


async def _nothing() -> None:
    return None
