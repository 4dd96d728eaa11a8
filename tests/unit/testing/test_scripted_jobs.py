"""The scripted source and run_job: watermarks between records, failures at a position,
checkpoints at a position, committed outputs per name (side outputs included)."""

from __future__ import annotations

from typing import Any

import pytest

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.api.functions import KeyedProcessFunction
from aiostream_ckpt.errors import ConfigError, JobFailedError
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.state.descriptors import ValueStateDescriptor
from aiostream_ckpt.testing import (
    Checkpoint,
    CollectingSinks,
    Fail,
    InjectedFailure,
    ScriptedSource,
    Watermark,
    run_job,
)
from aiostream_ckpt.time import (
    AggregateFunction,
    OutputTag,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)


class Sum(AggregateFunction):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: dict[str, Any], accumulator: int) -> int:
        return accumulator + value["v"]

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, a: int, b: int) -> int:
        return a + b


class RunningCount(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        n = self.count.value() + 1
        self.count.update(n)
        out.collect((ctx.current_key, n))


def ev(ts: int, v: int = 1) -> dict[str, Any]:
    return {"k": "a", "ts": ts, "v": v}


def windowed_sums(script: list[Any], batch_size: int) -> dict[str, list[Any]]:
    late = OutputTag("late")
    env = StreamEnvironment("late", config=JobConfig(batch_size=batch_size))
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(
        lambda e: e["ts"]
    )
    sums = (
        env.from_source(ScriptedSource(script), uid="src", watermark_strategy=strategy)
        .key_by(lambda e: e["k"])
        .window(TumblingEventTimeWindows.of(10_000))
        .side_output_late_data(late)
        .aggregate(Sum(), uid="sum")
    )
    return dict(run_job(env, {"sums": sums, "late": sums.get_side_output(late)}))


@pytest.mark.parametrize("batch_size", [1, 1000])
def test_a_watermark_marker_makes_the_next_record_late_at_any_batch_size(batch_size: int) -> None:
    script = [ev(1_000, 1), ev(2_000, 2), Watermark(15_000), ev(5_000, 4), ev(16_000, 8)]
    out = windowed_sums(script, batch_size)
    assert out == {"sums": [3, 8], "late": [ev(5_000, 4)]}


def test_without_a_marker_lateness_depends_on_the_batches() -> None:
    """Why the marker exists: in one batch the older record is on time."""
    script = [ev(1_000, 1), ev(15_000, 2), ev(5_000, 4)]
    assert windowed_sums(script, 1000) == {"sums": [5, 2], "late": []}
    assert windowed_sums(script, 1) == {"sums": [1, 2], "late": [ev(5_000, 4)]}


def build_counts(script: list[Any]) -> tuple[StreamEnvironment, Any, list[str]]:
    env = StreamEnvironment("counts")
    seen: list[str] = []

    def note(x: str) -> str:
        seen.append(x)
        return x

    counts = (
        env.from_source(ScriptedSource(script), uid="src")
        .map(note, uid="note")
        .key_by(lambda x: x)
        .process(RunningCount(), uid="count")
    )
    return env, counts, seen


def test_fail_markers_restart_the_job_and_the_committed_output_is_unchanged() -> None:
    env, counts, _ = build_counts(["a", "b", "a"])
    clean = run_job(env, {"counts": counts})
    env, counts, seen = build_counts(["a", "b", Fail(attempts=2), "a"])
    failed = run_job(env, {"counts": counts})
    assert clean.restarts == 0 and failed.restarts == 2
    assert failed["counts"] == clean["counts"] == [("a", 1), ("b", 1), ("a", 2)]
    assert seen.count("b") == 3, "no checkpoint before the failure: every attempt replays"


def test_a_checkpoint_marker_makes_the_restart_restore_state_from_it() -> None:
    env, counts, seen = build_counts(["a", "b", Checkpoint(), "a", Fail(), "a"])
    out = run_job(env, {"counts": counts}, checkpoint_interval=0.01)
    assert out["counts"] == [("a", 1), ("b", 1), ("a", 2), ("a", 3)]
    assert out.restarts == 1 and out.last_checkpoint is not None
    # restored after "b": only the records after the checkpoint were read again
    assert seen == ["a", "b", "a", "a", "a"]


def test_more_failures_than_restarts_fail_the_run_with_the_injected_error() -> None:
    env, counts, _ = build_counts(["a", Fail(attempts=3, reason="broker gone")])
    with pytest.raises(JobFailedError, match="broker gone") as info:
        run_job(env, {"counts": counts}, restarts=2)
    assert isinstance(info.value.__cause__, InjectedFailure)


def test_a_checkpoint_marker_without_periodic_checkpoints_is_refused() -> None:
    env, counts, _ = build_counts(["a", Checkpoint(), "b"])
    with pytest.raises(ConfigError, match="checkpoint_interval"):
        run_job(env, {"counts": counts}, checkpoint_interval=0)


def test_an_output_name_is_collected_once() -> None:
    env = StreamEnvironment("twice")
    numbers = env.from_collection([1])
    sinks = CollectingSinks()
    sinks.attach("n", numbers)
    with pytest.raises(ValueError, match="'n' is collected twice"):
        sinks.attach("n", numbers)
