"""Mistakes a new user makes name the fix, not only the Python error they caused."""

from __future__ import annotations

from typing import Any

import pytest

from aiostream_ckpt.api import KeyedProcessFunction, StreamEnvironment
from aiostream_ckpt.api.functions import Collector, Context
from aiostream_ckpt.errors import JobFailedError
from aiostream_ckpt.jobspec.config import JobConfig, RestartConfig
from aiostream_ckpt.jobspec.windows import TumblingEventTimeWindows
from aiostream_ckpt.state.descriptors import ValueStateDescriptor


@pytest.mark.parametrize("name", ["window", "reduce", "interval_join"])
def test_a_keyed_only_operator_on_an_unkeyed_stream_says_key_by(name: str) -> None:
    stream = StreamEnvironment("unkeyed").from_collection([1, 2])
    with pytest.raises(AttributeError, match=rf"{name}\(\) works per key.*\.key_by\(") as err:
        getattr(stream, name)
    assert err.value.name == name
    keyed = stream.key_by(lambda r: r)
    assert callable(getattr(keyed, name))


def test_other_missing_attributes_stay_plain_attribute_errors() -> None:
    stream = StreamEnvironment("unkeyed").from_collection([1])
    with pytest.raises(AttributeError, match=r"^'Stream' object has no attribute 'windw'$"):
        stream.windw  # type: ignore[attr-defined]  # noqa: B018
    assert not hasattr(stream, "window")


class Count(KeyedProcessFunction[Any, int]):
    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def process_element(self, value: Any, ctx: Context, out: Collector[int]) -> None:
        self.n.update(self.n.value() + 1)
        out.collect(self.n.value())


def _fails(build: Any, parallelism: int) -> str:
    config = JobConfig(parallelism=parallelism, restart=RestartConfig(attempts=0))
    env = StreamEnvironment("unhashable", config=config)
    events = env.from_collection([{"k": [1, 2], "ts": 1}, {"k": [3], "ts": 2}])
    with pytest.raises(JobFailedError) as failed:
        env.execute_and_collect(build(events.key_by(lambda r: r["k"])))
    return str(failed.value)


@pytest.mark.parametrize("parallelism", [1, 2])
@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda k: k.reduce(lambda a, b: a, uid="r"), id="reduce"),
        pytest.param(lambda k: k.process(Count(), uid="p"), id="process"),
        pytest.param(
            lambda k: k.window(
                TumblingEventTimeWindows.of(10), timestamp_assigner=lambda r: r["ts"]
            ).reduce(lambda a, b: a, uid="w"),
            id="window",
        ),
    ],
)
def test_an_unhashable_key_names_the_key_selector(build: Any, parallelism: int) -> None:
    message = _fails(build, parallelism)
    assert "unhashable type: 'list'" in message, message
    assert "(the key selector of key_by returned [" in message, message
    assert "a list: keys must be hashable, e.g. a tuple instead of a list)" in message, message
