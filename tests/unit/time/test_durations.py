"""Durations: the config's strings work in the event-time API and state TTL (issue 16, item 5)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from aiostream_ckpt.daemon.config import load_config
from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.jobspec.watermarks import WatermarkStrategy
from aiostream_ckpt.jobspec.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)
from aiostream_ckpt.state.descriptors import StateTtlConfig


def test_window_sizes_take_the_config_strings() -> None:
    assert TumblingEventTimeWindows.of("1m").size == 60_000
    assert TumblingEventTimeWindows.of("1m").size == TumblingEventTimeWindows.of(60_000).size
    sliding = SlidingEventTimeWindows.of("1h", "5m")
    assert (sliding.size, sliding.slide) == (3_600_000, 300_000)
    assert EventTimeSessionWindows.with_gap("30s").gap == 30_000
    assert TumblingEventTimeWindows.of(timedelta(minutes=1)).size == 60_000


def test_watermarks_take_the_config_strings() -> None:
    s = WatermarkStrategy.for_bounded_out_of_orderness("5s").with_idleness("250ms")
    assert (s.max_out_of_orderness_ms, s.idle_timeout_ms) == (5000, 250)


def test_same_text_same_time_as_the_config() -> None:
    loaded = load_config(sets=["checkpoint.interval=1m"])
    assert loaded.job.checkpoint.interval * 1000 == TumblingEventTimeWindows.of("1m").size


def test_state_ttl_takes_the_config_strings() -> None:
    assert StateTtlConfig("10m").ttl == 600.0  # type: ignore[arg-type]
    assert StateTtlConfig(90).ttl == 90.0


@pytest.mark.parametrize("bad", ["1", "soon", "-1s", True])
def test_a_string_without_a_unit_or_garbage_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="window size must be"):
        TumblingEventTimeWindows.of(bad)  # type: ignore[arg-type]
