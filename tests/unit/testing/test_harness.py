"""KeyedFunctionHarness: timers on explicit watermarks and the manual clock, side
outputs, state access, snapshot/restore, and the function's own errors."""

from __future__ import annotations

from typing import Any

import pytest

from aiostream_ckpt.api.functions import KeyedProcessFunction, TimeDomain
from aiostream_ckpt.state.descriptors import ListStateDescriptor
from aiostream_ckpt.testing import KeyedFunctionHarness
from aiostream_ckpt.time import OutputTag

SEEN = ListStateDescriptor("seen")
TOO_EARLY = OutputTag("too-early")


class Sessionize(KeyedProcessFunction):
    """Collect values per key; flush 1 s of event time after the first, or after 5 s idle."""

    def open(self, ctx: Any) -> None:
        self.seen = ctx.get_state(SEEN)

    def process_element(self, value: dict[str, Any], ctx: Any, out: Any) -> None:
        timers = ctx.timer_service()
        if value["ts"] <= timers.current_watermark():
            ctx.output(TOO_EARLY, value)
            return
        if not self.seen.get():
            timers.register_event_time_timer(value["ts"] + 1_000)
            timers.register_processing_time_timer(timers.current_processing_time() + 5_000)
        self.seen.add(value["v"])

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        values = self.seen.get()
        if values:
            out.collect((ctx.current_key, ctx.time_domain.value, timestamp, values))
        self.seen.clear()


def harness(**kw: Any) -> KeyedFunctionHarness[Any, Any]:
    return KeyedFunctionHarness(Sessionize(), key_selector=lambda e: e["k"], **kw)


def ev(k: str, ts: int, v: int) -> dict[str, Any]:
    return {"k": k, "ts": ts, "v": v}


def test_event_time_timers_fire_only_when_the_watermark_reaches_them() -> None:
    h = harness()
    h.process_element(ev("a", 100, 1))
    h.process_element(ev("b", 300, 2))
    h.process_element(ev("a", 200, 3))
    h.process_watermark(1_099)
    assert h.output() == []
    assert h.pending_timers() == (2, 2)
    h.process_watermark(1_300)
    assert h.output() == [("a", "event_time", 1_100, [1, 3]), ("b", "event_time", 1_300, [2])]
    h.close()


def test_processing_time_timers_fire_on_the_manual_clock() -> None:
    h = harness(processing_time=10_000)
    h.process_element(ev("a", 100, 1))
    h.set_processing_time(14_999)
    assert h.output() == []
    h.set_processing_time(15_000)
    assert h.output() == [("a", TimeDomain.PROCESSING_TIME.value, 15_000, [1])]
    h.close()


def test_records_behind_the_watermark_go_to_the_side_output() -> None:
    h = harness()
    h.process_watermark(500)
    h.process_element(ev("a", 400, 1))
    h.process_element(ev("a", 600, 2))
    assert h.side_output(TOO_EARLY) == [ev("a", 400, 1)]
    assert h.side_output(OutputTag("other")) == []
    h.clear_output()
    assert h.side_output(TOO_EARLY) == []
    h.close()


def test_state_can_be_read_and_set_per_key() -> None:
    h = harness()
    h.process_element(ev("a", 100, 1))
    h.process_element(ev("b", 100, 2))
    assert h.state(SEEN, key="a").get() == [1]
    assert sorted(h.keys("seen")) == ["a", "b"]
    h.state(SEEN, key="a").add(7)  # set up a case by hand
    h.process_watermark(2_000)
    assert ("a", "event_time", 1_100, [1, 7]) in h.output()
    h.close()


def test_state_timers_watermark_and_clock_survive_a_snapshot_and_restore() -> None:
    h = harness(processing_time=1_000)
    h.process_element(ev("a", 100, 1))
    h.process_watermark(600)
    snap = h.snapshot()
    h.process_element(ev("a", 150, 99))  # after the snapshot: not in it
    h.close()

    r = harness(restore_from=snap)
    assert r.state(SEEN, key="a").get() == [1]
    assert r.pending_timers() == (1, 1)
    assert r.watermark == 600
    r.process_element(ev("a", 550, 2))  # behind the restored watermark
    assert r.side_output(TOO_EARLY) == [ev("a", 550, 2)]
    r.set_processing_time(6_000)  # the restored clock was 1 000: the 5 s timer is due
    assert r.output() == [("a", "processing_time", 6_000, [1])]
    r.close()


async def test_snapshot_in_an_async_test_is_awaited() -> None:
    h = harness()
    h.process_element(ev("a", 100, 1))
    with pytest.raises(RuntimeError, match="await snapshot_async"):
        h.snapshot()
    snap = await h.snapshot_async()
    h.close()
    r = harness(restore_from=snap)
    r.process_watermark(1_100)
    assert r.output() == [("a", "event_time", 1_100, [1])]
    r.close()


class Fragile(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        if value < 0:
            raise ValueError(f"negative: {value}")
        out.collect((ctx.current_key, value))


def test_explicit_keys_errors_and_watermark_order() -> None:
    h = KeyedFunctionHarness(Fragile())
    h.process_element(1, key="x")
    assert h.output() == [("x", 1)]
    assert h.pending_timers() == (0, 0)
    with pytest.raises(ValueError, match="negative: -1"):
        h.process_element(-1, key="x")
    with pytest.raises(TypeError, match="key="):
        h.process_element(2)
    h.process_watermark(10)
    with pytest.raises(ValueError, match="never go backwards"):
        h.process_watermark(9)
    h.close()
