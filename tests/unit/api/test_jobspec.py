"""StreamEnvironment.spec(): a frozen, typed description the runtime runs, not the builder."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.collection import CollectionSource, CollectSink
from aiostream_ckpt.errors import JobGraphError
from aiostream_ckpt.jobspec.graph import JobSpec, Partitioning, TransformKind
from aiostream_ckpt.jobspec.watermarks import WatermarkStrategy
from aiostream_ckpt.runtime.job import JobStatus, run_job
from aiostream_ckpt.time import TumblingEventTimeWindows

WMS = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(lambda e: e[1])


def _build(env: StreamEnvironment, sink: CollectSink) -> None:
    events = env.from_source(CollectionSource([("a", 1), ("b", 2), ("a", 3)]), uid="events",
                             watermark_strategy=WMS)  # fmt: skip
    counts = (
        events.key_by(lambda e: e[0])
        .window(TumblingEventTimeWindows.of(10))
        .reduce(lambda x, y: (x[0], x[1] + y[1]), uid="sums", value_type=tuple[str, int])
    )
    counts.map(list, uid="as-list").sink_to(sink, uid="sink", parallelism=1)


def _shape(spec: JobSpec) -> list[tuple[Any, ...]]:
    return [
        (t.uid, t.kind, t.parallelism, t.partitioning, tuple(i.uid for i in t.inputs))
        for t in spec.transformations
    ]


def test_the_spec_is_frozen_and_later_builder_calls_do_not_change_it() -> None:
    env = StreamEnvironment("spec", params={"k": 1})
    _build(env, CollectSink())
    spec = env.spec()
    node = spec.transformations[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.parallelism = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.params["k"] = 2  # type: ignore[index]
    env.from_collection([1], uid="more").print()
    env.params["k"] = 3
    assert [t.uid for t in spec.transformations] == ["events", "sums", "as-list", "sink"]
    assert spec.params == {"k": 1}


def test_nodes_carry_their_typed_parts() -> None:
    env = StreamEnvironment("spec")
    _build(env, CollectSink())
    events, sums, as_list, sink = env.spec().transformations
    assert sink.kind is TransformKind.SINK and isinstance(sink.sink(), CollectSink)
    assert events.kind is TransformKind.SOURCE and events.watermark_strategy is WMS
    assert isinstance(events.source(), CollectionSource)
    assert sums.kind is TransformKind.WINDOW and sums.partitioning is Partitioning.HASH
    assert sums.inputs == (events,)
    assert as_list.function() is list
    with pytest.raises(JobGraphError, match="'as-list' needs a Sink"):
        as_list.sink()


def test_building_the_app_again_gives_the_same_spec_and_the_runtime_runs_it(
    tmp_path: Path,
) -> None:
    first, second = StreamEnvironment("spec"), StreamEnvironment("spec")
    _build(first, CollectSink())
    sink = CollectSink()
    _build(second, sink)
    assert _shape(first.spec()) == _shape(second.spec())
    spec = second.spec()
    late = CollectSink()  # added to the builder after the spec was taken: not in the job
    second.from_collection([("c", 9)], uid="late-source").sink_to(late, uid="late-sink")
    config = spec.config.with_checkpoint_dir(tmp_path / "checkpoints")
    result = run_job(dataclasses.replace(spec, config=config))
    assert result.status is JobStatus.FINISHED
    assert sorted(sink.results) == [["a", 4], ["b", 2]]
    assert late.results == []
