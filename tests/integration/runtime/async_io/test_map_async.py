"""``map_async`` against a real HTTP service on a loopback port (aiohttp, in a thread).

The service records every request it served and how many it served at once,
so order, the capacity bound, timeouts and failures are observed from its side.
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest

from aiostream_ckpt.api import AsyncRetry, StreamEnvironment
from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.connectors.collection import CollectSink
from aiostream_ckpt.connectors.staging import read_committed_output
from aiostream_ckpt.errors import JobFailedError
from aiostream_ckpt.jobspec.config import (
    CheckpointConfig,
    ErrorConfig,
    JobConfig,
    ProcessErrorPolicy,
    RestartConfig,
    RestartStrategyKind,
)
from aiostream_ckpt.runtime.job import JobResult, JobRun, JobRunner
from aiostream_ckpt_dev.lookup_service import LookupService, segment_of
from apps.enrich import HttpLookup, LeanHttpLookup
from tests.helpers import ScriptedSource, make_pv_input, run_app_under_kills, wait_until

pytestmark = pytest.mark.integration


def events(n: int) -> list[dict[str, Any]]:
    return [{"seq": i, "app_id": f"app-{i % 13}"} for i in range(n)]


def enriched(e: dict[str, Any]) -> dict[str, Any]:
    return {"seq": e["seq"], "app_id": e["app_id"], "segment": segment_of(e["app_id"])}


def job_env(tmp_path: Path, *, dead_letter: bool = False, **kw: Any) -> StreamEnvironment:
    config = JobConfig(
        batch_size=kw.pop("batch_size", 64),
        checkpoint=CheckpointConfig(directory=tmp_path / "ckpt", interval=kw.pop("interval", 0.05)),
        restart=RestartConfig(strategy=RestartStrategyKind.NONE),
        errors=ErrorConfig(on_process_error=ProcessErrorPolicy.DEAD_LETTER)
        if dead_letter
        else ErrorConfig(),
    )
    return StreamEnvironment("enrich", config=config)


def test_ordered_output_keeps_input_order_and_capacity_holds_at_the_server(
    tmp_path: Path,
) -> None:
    # per-seq latencies make later calls finish first
    slow = {i: 0.002 * (i % 7) for i in range(600)}
    with LookupService(latency=0.0, slow=slow) as svc:
        env = job_env(tmp_path)
        src = env.from_collection(events(600), uid="events")
        out = env.execute_and_collect(src.map_async(HttpLookup(svc.url), capacity=16, uid="lookup"))
        assert out == [enriched(e) for e in events(600)]
        assert 1 < svc.max_concurrent <= 16, svc.max_concurrent
        assert sorted(svc.served_seqs()) == list(range(600))


async def test_the_lean_client_in_order_within_capacity_and_past_a_timed_out_call(
    tmp_path: Path,
) -> None:
    """``apps.keepalive_http`` behind ``map_async``: a timed-out call's connection is dropped."""
    slow = {i: 0.002 * (i % 7) for i in range(300)} | {42: 30.0}
    with LookupService(latency=0.0, slow=slow) as svc:
        env = job_env(tmp_path, dead_letter=True)
        sink = CollectSink()
        src = env.from_collection(events(300), uid="events")
        lookup = TrackedLean(svc.url, 16)
        src.map_async(lookup, capacity=16, timeout=0.5, uid="lookup").sink_to(sink, uid="sink")
        await run_past_a_timeout(env, 42, 16, 0.5)
        # + 1: seq 42's handler sleeps on after its call timed out and its connection
        # closed (aiohttp's server does not cancel it), while 16 newer calls are out
        assert 1 < svc.max_concurrent <= 16 + 1, svc.max_concurrent
    assert sink.results == [enriched(e) for e in events(300) if e["seq"] != 42]


def test_unordered_output_is_complete_and_arrives_out_of_order(tmp_path: Path) -> None:
    slow = {i: 0.02 if i % 10 == 0 else 0.0 for i in range(300)}
    with LookupService(latency=0.0, slow=slow) as svc:
        env = job_env(tmp_path)
        src = env.from_collection(events(300), uid="events")
        out = env.execute_and_collect(
            src.map_async(HttpLookup(svc.url), capacity=32, ordered=False, uid="lookup")
        )
        assert sorted(out, key=lambda r: r["seq"]) == [enriched(e) for e in events(300)]
        assert [r["seq"] for r in out] != list(range(300))  # slow ones came later
        assert svc.max_concurrent <= 32


class Tracked:
    """Notes the calls that started and ended (a lookup's mixin), for tests that move the clock.

    Each subtask runs a copy of the function (``runtime.graph``): the notes are the class's.
    """

    started: ClassVar[set[int]] = set()
    ended: ClassVar[set[int]] = set()

    async def invoke(self, value: dict[str, Any]) -> dict[str, Any]:
        Tracked.started.add(value["seq"])
        try:
            out: dict[str, Any] = await super().invoke(value)  # type: ignore[misc]
            return out
        finally:
            Tracked.ended.add(value["seq"])


class TrackedHttp(Tracked, HttpLookup):
    pass


class TrackedLean(Tracked, LeanHttpLookup):
    pass


async def run_past_a_timeout(
    env: StreamEnvironment, hung: int, capacity: int, call_timeout: float
) -> JobResult:
    """Run the job on a ManualClock, moved past ``call_timeout`` once ``hung``'s call is all out.

    In order, ``hung`` holds the queue: calls up to ``hung + capacity - 1`` are
    issued, no more. The clock stands still until they all ended, so no other
    call times out however long a loaded machine takes (with real time each
    had to come back within the timeout too, or the test failed on it).
    """
    Tracked.started.clear()
    Tracked.ended.clear()
    clock = ManualClock()
    job = asyncio.ensure_future(JobRunner(env.spec(), clock=clock).run())
    issued = set(range(hung + capacity))

    def only_hung_out() -> bool:
        return issued <= Tracked.started and Tracked.started - Tracked.ended == {hung}

    try:
        await wait_until(only_hung_out, limit=120)
    except BaseException:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
        raise
    clock.advance(call_timeout)
    return await asyncio.wait_for(job, 60)


async def test_a_call_past_its_timeout_fails_the_job_naming_the_operator(tmp_path: Path) -> None:
    with LookupService(latency=0.0, slow={42: 30.0}) as svc:
        env = job_env(tmp_path)
        src = env.from_collection(events(100), uid="events")
        src.map_async(TrackedHttp(svc.url), capacity=8, timeout=0.3, uid="lookup").sink_to(
            CollectSink(), uid="sink"
        )
        with pytest.raises(JobFailedError) as info:
            await run_past_a_timeout(env, 42, 8, 0.3)
    text = f"{info.value} {info.value.cause}"
    assert "operator 'lookup'" in text and "timed out after 0.3 s" in text, text
    assert "'seq': 42" in text, text


def test_a_raising_call_fails_the_job_and_a_retry_policy_rides_over_flaky_ones(
    tmp_path: Path,
) -> None:
    from aiostream_ckpt.runtime.job import run_job

    with LookupService(latency=0.0, fail={17}) as svc:
        env = job_env(tmp_path)
        src = env.from_collection(events(50), uid="events")
        src.map_async(HttpLookup(svc.url), capacity=8, uid="lookup").sink_to(
            CollectSink(), uid="sink"
        )
        with pytest.raises(JobFailedError) as info:
            run_job(env.spec())
    text = f"{info.value} {info.value.cause}"
    assert "operator 'lookup'" in text and "raised ClientResponseError" in text, text
    assert "500" in text, text

    with LookupService(latency=0.0, failure_rate=0.3, seed=5) as svc:
        env = job_env(tmp_path / "retry")
        src = env.from_collection(events(200), uid="events")
        retry = AsyncRetry(attempts=20, delay=0.001, backoff=1.0)
        out = env.execute_and_collect(
            src.map_async(HttpLookup(svc.url), capacity=8, retry=retry, uid="lookup")
        )
        assert out == [enriched(e) for e in events(200)]
        failed = sum(1 for r in svc.served if r.status == 500)
        assert failed > 20 and len(svc.served) == 200 + failed


async def test_dead_letter_policy_takes_failed_and_timed_out_calls_and_the_job_goes_on(
    tmp_path: Path,
) -> None:
    """errors.on_process_error=dead_letter: each failed record once, with its traceback."""
    with LookupService(latency=0.0, fail={17}, slow={42: 30.0}) as svc:
        env = job_env(tmp_path, dead_letter=True, batch_size=16)
        sink = CollectSink()
        src = env.from_collection(events(100), uid="events")
        src.map_async(TrackedHttp(svc.url), capacity=8, timeout=0.5, uid="lookup").sink_to(
            sink, uid="sink"
        )
        await run_past_a_timeout(env, 42, 8, 0.5)
    assert sink.results == [enriched(e) for e in events(100) if e["seq"] not in (17, 42)]
    dead = [
        d
        for task_dir in sorted((tmp_path / "ckpt" / "dead-letter").iterdir())
        for d in read_committed_output(task_dir, prefix="dead-letter")
    ]
    by_seq = {orjson.loads(d["raw"])["seq"]: d for d in dead}
    assert sorted(by_seq) == [17, 42] and len(dead) == 2
    assert by_seq[17]["origin"]["operator"] == "lookup"
    assert (
        "ClientResponseError" in by_seq[17]["reason"]
        and "raise_for_status" in by_seq[17]["traceback"]
    )
    assert "TimeoutError" in by_seq[42]["reason"]


async def test_checkpoint_completes_with_a_call_in_flight_and_holds_its_record(
    tmp_path: Path,
) -> None:
    """The barrier does not wait for calls: the slow record is in the checkpoint instead."""
    with LookupService(latency=0.0, slow={3: 5.0}) as svc:
        env = job_env(tmp_path, interval=0.05)
        sink = CollectSink()
        source = ScriptedSource("scripted")  # stays open, so checkpoints go on
        source.queue.put_nowait(events(40))
        src = env.from_source(source, uid="events")
        # room for all 40: with a full queue the task would read no barrier (as in Flink)
        src.map_async(HttpLookup(svc.url), capacity=64, uid="lookup").sink_to(sink, uid="sink")
        started: asyncio.Future[JobRun] = asyncio.get_running_loop().create_future()
        job = asyncio.create_task(JobRunner(env.spec(), on_started=started.set_result).run())
        run = await started
        coord = run.coordinator
        assert coord is not None

        def holds_seq_3() -> bool:
            ck = coord.latest_completed
            if ck is None:
                return False
            states = ck.subtask_states("lookup").values()
            held = [orjson.loads(r) for st in states for r in st["operator"]["in_flight"]]
            return any(r["seq"] == 3 for r in held)

        await wait_until(holds_seq_3, limit=4.0)
        assert svc.requests_for(3) == 0  # its call had not come back yet
        source.queue.put_nowait(None)
        await asyncio.wait_for(job, 30)
        assert sink.results == [enriched(e) for e in events(40)]


@pytest.mark.parametrize("seed", range(2))
def test_kill9_with_calls_in_flight_commits_each_result_exactly_once(
    tmp_path: Path, seed: int
) -> None:
    n = 40_000
    inp = make_pv_input(tmp_path / "in.jsonl", n, seed=seed, malformed=1)
    out = tmp_path / "out"
    with LookupService(latency=0.005, seed=seed) as svc:
        run_app_under_kills(
            tmp_path,
            "apps.enrich",
            [
                f"app.input={inp}",
                f"app.output={out}",
                f"app.service={svc.url}",
                "app.capacity=64",
                f"app.ordered={1 - seed}",
                "checkpoint.interval=100ms",
            ],
            kills=2,
            seed=seed,
            inputs=[inp],
            batch_size=256,
            max_delay_after_checkpoint=0.3,
            timeout=400,
        )
        served = collections.Counter(svc.served_seqs())
    rows = list(read_committed_output(out))
    seqs = collections.Counter(r["seq"] for r in rows)
    assert not [s for s, c in seqs.items() if c > 1], "duplicated outputs"
    assert set(seqs) == set(range(n)), f"missing {n - len(seqs)}"
    assert all(r["segment"] == segment_of(r["app_id"]) for r in rows)
    if seed == 0:  # ordered: re-issued records come back before newer input
        assert [r["seq"] for r in rows] == list(range(n))
    # every record was looked up; after each kill some were looked up again
    assert set(served) == set(range(n))
    repeated = sum(c - 1 for c in served.values())
    assert repeated > 0, "no request was repeated: the kills hit no call in flight"
