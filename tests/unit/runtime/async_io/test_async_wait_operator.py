"""The async wait operator alone: order, watermarks, capacity, errors, snapshot and restore.

Calls are futures the test completes, so every interleaving is chosen, not waited for.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest

from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.errors import StateError
from aiostream_ckpt.jobspec.async_functions import AsyncFunction, AsyncRetry, AsyncSpec
from aiostream_ckpt.runtime.async_io.async_wait import AsyncCallError, AsyncWaitOperator
from aiostream_ckpt.runtime.elements import Watermark
from aiostream_ckpt.state.keygroups import KeyGroupRange, key_group_for, serialize_key
from tests.helpers import completed_checkpoint


class Controlled(AsyncFunction[int, str]):
    """Each call waits until the test resolves (or fails) its record's future."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.futures: dict[int, asyncio.Future[str]] = {}

    async def invoke(self, value: int) -> str:
        self.calls.append(value)
        fut = self.futures.get(value)
        if fut is None or fut.done():
            fut = self.futures[value] = asyncio.get_running_loop().create_future()
        return await fut

    def answer(self, value: int) -> None:
        self.futures[value].set_result(f"r{value}")


def make(fn: AsyncFunction[Any, Any], *, capacity: int = 10, ordered: bool = True, **kw: Any):
    spec = AsyncSpec(
        fn,
        capacity,
        kw.pop("timeout", None),
        ordered,
        kw.pop("retry", None),
        kw.pop("serializer", "json"),
    )
    return AsyncWaitOperator("lookup", spec, kw.pop("key_selector", None))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def flat(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for it in items:
        out.extend(it if type(it) is list else [it])
    return out


async def test_ordered_emits_in_input_order_whatever_the_completion_order() -> None:
    fn = Controlled()
    op = make(fn, capacity=10)
    op.offer([1, 2, 3])
    await settle()
    fn.answer(3)
    fn.answer(2)
    await settle()
    assert op.pop_ready() == []  # 1 is still out: nothing may overtake it
    fn.answer(1)
    await settle()
    assert flat(op.pop_ready()) == ["r1", "r2", "r3"]
    assert op.idle
    await op.stop()


async def test_unordered_emits_as_results_arrive_but_never_across_a_watermark() -> None:
    fn = Controlled()
    op = make(fn, capacity=10, ordered=False)
    op.offer([1, 2])
    await settle()
    op.add_watermark(Watermark(100))
    op.offer([3, 4])
    await settle()
    fn.answer(4)
    fn.answer(2)
    await settle()
    assert flat(op.pop_ready()) == ["r2"]  # 4 is behind the watermark, 1 is out
    fn.answer(1)
    await settle()
    # the watermark goes once everything before it went, then what came after it
    assert flat(op.pop_ready()) == ["r1", Watermark(100), "r4"]
    fn.answer(3)
    await settle()
    assert flat(op.pop_ready()) == ["r3"]
    await op.stop()


async def test_ordered_watermark_leaves_after_the_records_before_it() -> None:
    fn = Controlled()
    op = make(fn)
    op.offer([1])
    await settle()
    op.add_watermark(Watermark(5))
    op.offer([2])
    await settle()
    fn.answer(2)
    await settle()
    assert op.pop_ready() == []
    fn.answer(1)
    await settle()
    assert op.pop_ready() == [["r1"], Watermark(5), ["r2"]]
    await op.stop()


async def test_capacity_bounds_calls_and_the_rest_of_the_batch_waits() -> None:
    fn = Controlled()
    op = make(fn, capacity=3)
    op.offer([1, 2, 3, 4, 5])
    await settle()
    assert fn.calls == [1, 2, 3]
    assert op.blocked and op.in_flight == 3
    fn.answer(2)
    await settle()
    assert op.pop_ready() == []  # in order: 2 waits for 1 and keeps its slot
    assert fn.calls == [1, 2, 3]
    fn.answer(1)
    await settle()
    assert flat(op.pop_ready()) == ["r1", "r2"]
    await settle()
    assert fn.calls == [1, 2, 3, 4, 5]  # two slots freed, two records admitted
    assert not op.blocked
    await op.stop()


async def test_a_raising_call_fails_with_the_operator_and_the_record_named() -> None:
    fn = Controlled()
    op = make(fn)
    op.offer([1, 2])
    await settle()
    fn.futures[1].set_exception(ValueError("service said no"))
    await settle()
    fn.answer(2)
    await settle()
    first, second = op.pop_ready()
    assert isinstance(first, AsyncCallError) and first.record == 1
    assert re.search(r"operator 'lookup'.*raised ValueError.*record 1", str(first))
    assert isinstance(first.__cause__, ValueError)
    assert "in invoke" in first.detail  # the user's frames, for the failure log
    assert second == ["r2"]  # what comes after the failure is not lost
    await op.stop()


async def started(fn: AsyncFunction[Any, Any], clock: ManualClock, **kw: Any) -> AsyncWaitOperator:
    """An operator whose timeouts and retries run on ``clock``."""
    op = make(fn, **kw)
    await op.start(None, clock)  # type: ignore[arg-type]
    return op


async def test_a_timed_out_call_fails_naming_the_timeout() -> None:
    fn = Controlled()  # never answered
    clock = ManualClock()
    op = await started(fn, clock, timeout=2.5)
    op.offer([7])
    await settle()
    clock.advance(2.0)
    await settle()
    assert op.pop_ready() == [] and fn.calls == [7]  # not yet: 0.5 s to go
    clock.advance(0.5)
    await settle()
    (err,) = op.pop_ready()
    assert isinstance(err, AsyncCallError)
    assert re.search(r"operator 'lookup'.*timed out after 2.5 s.*7", str(err))
    assert op.idle and clock.sleepers == 0  # no deadline left: the timer is gone too
    await op.stop()


async def test_only_the_calls_past_their_deadline_time_out() -> None:
    fn = Controlled()
    clock = ManualClock()
    op = await started(fn, clock, capacity=3, timeout=5.0)
    op.offer([1, 2, 3])
    await settle()
    fn.answer(1)
    fn.answer(3)
    await settle()
    assert flat(op.pop_ready()) == ["r1"]
    clock.advance(4.5)
    await settle()
    assert op.pop_ready() == []  # 2 is still in time, 3 waits behind it
    clock.advance(0.5)  # 2's deadline
    await settle()
    err, rest = op.pop_ready()
    assert isinstance(err, AsyncCallError) and err.record == 2 and "timed out" in str(err)
    assert rest == ["r3"]
    assert op.idle
    await op.stop()


async def test_each_call_times_out_at_its_own_deadline() -> None:
    """Deadlines count from each call's start; the timer moves on to the next one."""
    fn = Controlled()
    clock = ManualClock()
    op = await started(fn, clock, ordered=False, timeout=5.0)
    op.offer([1])
    await settle()
    clock.advance(3.0)
    op.offer([2])  # due at 8 s, 1 at 5 s
    await settle()
    clock.advance(2.0)
    await settle()
    (err,) = op.pop_ready()
    assert isinstance(err, AsyncCallError) and err.record == 1
    clock.advance(2.5)
    await settle()
    assert op.pop_ready() == [] and op.in_flight == 1
    clock.advance(0.5)
    await settle()
    (err,) = op.pop_ready()
    assert isinstance(err, AsyncCallError) and err.record == 2
    op.offer([3])  # a call after the timer ended gets one again
    await settle()
    fn.answer(3)
    clock.advance(5.0)
    await settle()
    assert flat(op.pop_ready()) == ["r3"]  # answered in time: no timeout
    assert clock.sleepers == 0
    await op.stop()


class FailTwice(AsyncFunction[int, int]):
    def __init__(self) -> None:
        self.attempts = 0

    async def invoke(self, value: int) -> int:
        self.attempts += 1
        if self.attempts < 3:
            raise ConnectionError("flaky")
        return value


async def test_retry_waits_on_the_injected_clock_then_succeeds() -> None:
    fn = FailTwice()
    clock = ManualClock()
    op = make(fn, retry=AsyncRetry(attempts=3, delay=1.0, backoff=2.0))
    await op.start(None, clock)  # type: ignore[arg-type]
    op.offer([9])
    await settle()
    assert fn.attempts == 1
    clock.advance(1.0)  # before attempt 2: delay
    await settle()
    assert fn.attempts == 2
    clock.advance(1.0)
    await settle()
    assert fn.attempts == 2  # before attempt 3: delay * backoff = 2 s
    clock.advance(1.0)
    await settle()
    assert flat(op.pop_ready()) == [9]
    await op.stop()


async def test_retry_gives_up_after_its_attempts() -> None:
    fn = FailTwice()
    op = make(fn, retry=AsyncRetry(attempts=2, delay=0.0))
    op.offer([9])
    await asyncio.wait_for(op.wakeup(), 5)
    await settle()
    (err,) = op.pop_ready()
    assert isinstance(err, AsyncCallError) and "ConnectionError" in str(err)
    assert fn.attempts == 2
    await op.stop()


def checkpoint_of(states: dict[int, dict[str, Any]], parallelism: int) -> CompletedCheckpoint:
    subtasks = {i: {"parallelism": parallelism, "operator": st} for i, st in states.items()}
    return completed_checkpoint("lookup", parallelism, subtasks)


async def test_snapshot_holds_every_record_not_emitted_and_restore_reissues_them() -> None:
    fn = Controlled()
    op = make(fn, capacity=2)
    op.offer([{"k": "a", "n": 1}, {"k": "b", "n": 2}, {"k": "c", "n": 3}])
    await settle()
    state = op.snapshot_state()
    assert state is not None
    # two calls in flight (not waited for) and one record waiting for room
    assert len(state["in_flight"]) == 3
    await op.stop()

    fn2 = Controlled()
    op2 = make(fn2, capacity=10)
    op2.restore_state(checkpoint_of({0: state}, 1), 0, 1)
    op2.admit()
    await settle()
    assert fn2.calls == [{"k": "a", "n": 1}, {"k": "b", "n": 2}, {"k": "c", "n": 3}]
    await op2.stop()


async def test_restore_at_another_parallelism_keeps_every_record_once() -> None:
    old = {j: {"in_flight": [f'{{"k":"k{j}-{i}"}}' for i in range(5)]} for j in range(3)}
    # non-keyed: old subtask j goes to new subtask j % 2
    got: list[Any] = []
    for sub in range(2):
        op = make(Controlled())
        op.restore_state(checkpoint_of(old, 3), sub, 2)
        got.extend(op.snapshot_state()["in_flight"])  # type: ignore[index]
    assert sorted(got) == sorted(r for st in old.values() for r in st["in_flight"])
    # keyed: each record goes to the subtask owning its key group
    seen: list[Any] = []
    for sub in range(2):
        op = make(Controlled(), key_selector=lambda r: r["k"])
        op.restore_state(checkpoint_of(old, 3), sub, 2)
        rng = KeyGroupRange.for_operator(sub, 2, 128)
        for raw in op.snapshot_state()["in_flight"]:  # type: ignore[index]
            key = raw.split('"')[3]
            assert key_group_for(serialize_key(key), 128) in rng
            seen.append(raw)
    assert sorted(seen) == sorted(got)


async def test_a_record_that_cannot_be_checkpointed_is_a_clear_error() -> None:
    op = make(Controlled())
    op.offer([{1, 2}])  # a set: not JSON
    await settle()
    with pytest.raises(StateError, match=r"operator 'lookup'.*serializer='pickle'"):
        op.snapshot_state()
    await op.stop()
    op = make(Controlled(), serializer="pickle")
    op.offer([{1, 2}])
    await settle()
    state = op.snapshot_state()
    op2 = make(Controlled(), serializer="pickle")
    op2.restore_state(checkpoint_of({0: state}, 1), 0, 1)  # type: ignore[dict-item]
    assert op2.blocked  # the set came back, waiting to be issued
    await op.stop()


def test_map_async_rejects_a_blocking_function() -> None:
    from aiostream_ckpt.api import StreamEnvironment

    env = StreamEnvironment("t")
    with pytest.raises(TypeError, match="async def"):
        env.from_collection([1]).map_async(lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="capacity"):

        async def f(x: int) -> int:
            return x

        env.from_collection([1]).map_async(f, capacity=0)


def test_keyed_map_async_at_parallelism_two_emits_every_record_once() -> None:
    from aiostream_ckpt.api import StreamEnvironment
    from aiostream_ckpt.jobspec.config import JobConfig

    async def tag(e: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.001 * (e["n"] % 3))
        return {**e, "seen": True}

    env = StreamEnvironment("t", config=JobConfig(batch_size=16))
    events = [{"k": f"k{i % 7}", "n": i} for i in range(300)]
    s = env.from_collection(events).key_by(lambda e: e["k"])
    out = env.execute_and_collect(s.map_async(tag, capacity=8, uid="tag", parallelism=2))
    assert sorted(r["n"] for r in out) == list(range(300))
    # per key, input order holds (ordered mode; a key lives on one subtask)
    for k in {e["k"] for e in events}:
        ns = [r["n"] for r in out if r["k"] == k]
        assert ns == sorted(ns)


def test_the_next_calls_are_out_before_the_chain_runs_on_results() -> None:
    """Room freed by results goes to new calls that start at once, not after the chain's work.

    Otherwise a round of ``capacity`` calls takes the service's latency *plus*
    the chain's time on the previous round's results (bench: 0.77x the target).
    """
    from aiostream_ckpt.api import StreamEnvironment
    from aiostream_ckpt.jobspec.config import JobConfig

    started: list[int] = []

    async def call(x: int) -> int:
        started.append(x)  # the call's first step: its request is out
        await asyncio.sleep(0)
        return x

    env = StreamEnvironment("t", config=JobConfig(batch_size=64))
    s = env.from_collection(list(range(40))).map_async(call, capacity=4, uid="call")
    out = env.execute_and_collect(s.map(lambda x: (x, len(started))))
    assert [x for x, _ in out] == list(range(40))
    # when the chain gets result x, the call of x + capacity is already out
    assert all(n >= min(40, x + 1 + 4) for x, n in out), out


class Record:
    """A record a weak reference can watch."""

    def __init__(self, n: int) -> None:
        self.n = n


class Echo(AsyncFunction[Any, Any]):
    async def invoke(self, value: Any) -> Any:
        return value


async def test_emitted_records_are_not_kept_until_their_timeout() -> None:
    import gc
    import weakref

    op = make(Echo(), capacity=10, timeout=3600, serializer="pickle")
    first = [Record(i) for i in range(10)]
    watched = [weakref.ref(r) for r in first]
    op.offer(first)  # type: ignore[arg-type]
    await settle()
    assert len(flat(op.pop_ready())) == 10
    del first
    op.offer([Record(10)])  # the next call: finished ones leave the deadline queue
    await settle()
    gc.collect()
    assert all(w() is None for w in watched)
    await op.stop()


def slept_so_far() -> float:
    """Seconds this thread has slept (in a poll, on I/O): wall time not on or waiting for a CPU.

    A loaded machine delays a thread in the run queue, and that time is
    counted apart (``/proc/thread-self/schedstat``: ns on a CPU, ns runnable
    and waiting), so an interval of this does not grow with the load the way
    a wall-clock one does.
    """
    with open("/proc/thread-self/schedstat") as f:
        on_cpu, runnable, _ = map(int, f.read().split())
    return time.monotonic() - (on_cpu + runnable) / 1e9


def test_a_call_timer_is_not_late_by_the_work_the_chain_just_did() -> None:
    """uvloop polls for as long as its cached time says; the task refreshes it before waiting.

    Otherwise a call's timer that fell due while the chain worked fired only
    once as long again had passed (the bench's simulated 10 ms calls took 11-16 ms):
    the loop slept in its poll for the 0.3 s it thought were left. What is
    measured is that sleep, not the wall time: on a loaded machine the loop
    may wait long for a CPU, and that wait is not the bug.
    """
    from aiostream_ckpt.api import StreamEnvironment

    woke: dict[int, float] = {}
    worked: list[float] = []

    async def call(x: int) -> int:
        await asyncio.sleep(0.3 if x == 1 else 0)  # 1 starts as 0 leaves
        woke[x] = slept_so_far()
        return x

    def work(x: int) -> int:
        if x == 0:  # the chain works on result 0 past the moment call 1's timer is due
            end = time.monotonic() + 0.6
            while time.monotonic() < end:
                pass
            worked.append(slept_so_far())
        return x

    env = StreamEnvironment("t")
    # capacity 1: record 2 waits for room, so the task waits on completions alone
    s = env.from_collection([0, 1, 2]).map_async(call, capacity=1, uid="call")
    assert env.execute_and_collect(s.map(work)) == [0, 1, 2]
    # due 0.3 s before the work ended: it fires at once, the loop does not sleep 0.3 s first
    assert woke[1] - worked[0] < 0.15, woke[1] - worked[0]
