"""Watermarks through ``map_async``: no result is overtaken by a watermark, in either order mode.

A window downstream drops records behind the watermark (no lateness), so any
result emitted after a watermark that should have followed it changes the
window sums; both modes must equal the brute-force sums.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.collection import CollectionSource
from aiostream_ckpt.time import TumblingEventTimeWindows
from tests.unit.runtime.windowing.test_windows import Describe, Sum, _events, _expected
from tests.unit.time.support import config, strategy


@pytest.mark.parametrize("ordered", [True, False])
def test_windows_after_map_async_equal_the_brute_force_sums(tmp_path: Path, ordered: bool) -> None:
    events, jittered = _events(600, seed=3, max_delay=1_500)
    rng = random.Random(9)
    delays = [rng.choice([0.0, 0.0, 0.001, 0.004]) for _ in events]

    async def slow_identity(e: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(delays[e["ts"] % len(delays)])
        return e

    assigner = TumblingEventTimeWindows.of(5_000)
    env = StreamEnvironment("w", config=config(tmp_path, batch_size=5))
    src = env.from_source(
        CollectionSource(jittered), uid="src", watermark_strategy=strategy(max_delay=2_000)
    )
    looked_up = src.map_async(slow_identity, capacity=16, ordered=ordered, uid="lookup")
    out = (
        looked_up.key_by(lambda e: e["k"]).window(assigner).aggregate(Sum(), Describe(), uid="win")
    )
    assert Counter(env.execute_and_collect(out)) == _expected(events, assigner)
