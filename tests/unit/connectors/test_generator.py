from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.generator import BLOCK, GeneratorSource, write_generated_jsonl
from aiostream_ckpt.errors import ConfigError


def ctx(subtask: int = 0, parallelism: int = 1, clock: Any = None) -> ConnectorContext:
    c = ConnectorContext("job", "gen", subtask, parallelism)
    if clock is not None:
        c.clock = clock
    return c


async def drain(src: GeneratorSource, c: ConnectorContext, restored: Any, batch: int) -> list[Any]:
    r = src.create_reader(c)
    await r.start(restored)
    out: list[Any] = []
    while (b := await r.read_batch(batch)) is not None:
        out.extend(b)
    return out


async def test_bounded_count_spread_over_splits_with_unique_seq() -> None:
    src = GeneratorSource(10_001, seed=3, splits=3, keys=50)
    events = await drain(src, ctx(), None, 1000)
    assert sorted(e["seq"] for e in events) == list(range(10_001))
    assert {e["app_id"] for e in events} <= {f"app-{k}" for k in range(50)}
    assert all(set(e) == {"app_id", "user_id", "ts", "seq"} for e in events)


@pytest.mark.parametrize("splits", [1, 3])
async def test_replay_from_any_position_reproduces_events(splits: int) -> None:
    count = 3 * BLOCK + 17
    src = GeneratorSource(count, seed=11, splits=splits, skew=1.2)
    reference = await drain(src, ctx(), None, 997)
    r = src.create_reader(ctx())
    await r.start(None)
    emitted: list[Any] = []
    for size in [1, BLOCK - 1, 5, BLOCK, 333, 2 * BLOCK]:
        b = await r.read_batch(size)
        assert b is not None
        emitted.extend(b)
        snap = orjson.loads(orjson.dumps(r.snapshot_position()))
        again = GeneratorSource(count, seed=11, splits=splits, skew=1.2)
        rest = await drain(again, ctx(), snap, 777)
        # Same multiset of events as a failure-free run, no duplicates, none missing.
        key = lambda e: e["seq"]  # noqa: E731
        assert sorted(emitted + rest, key=key) == sorted(reference, key=key)
        if splits == 1:
            assert emitted + rest == reference


async def test_event_is_a_pure_function_of_seed_split_index() -> None:
    a = GeneratorSource(None, seed=5, splits=2)
    b = GeneratorSource(100_000, seed=5, splits=2)
    assert a.generate(1, BLOCK - 3, BLOCK + 4) == b.generate(1, BLOCK - 3, BLOCK + 4)
    assert a.generate(1, BLOCK - 3, BLOCK + 4) == a.generate(1, 0, BLOCK + 4)[BLOCK - 3 :]
    assert a.generate(0, 0, 100) != a.generate(1, 0, 100)
    assert GeneratorSource(None, seed=6).generate(0, 0, 100) != a.generate(0, 0, 100)


async def test_parallel_readers_own_disjoint_splits_and_union_restore() -> None:
    src = GeneratorSource(5000, seed=1, splits=4)
    readers = [src.create_reader(ctx(k, 2)) for k in range(2)]
    first: list[Any] = []
    union: dict[str, Any] = {}
    for r in readers:
        await r.start(None)
        for _ in range(3):
            first.extend(await r.read_batch(100) or [])
        union.update(r.snapshot_position())
    assert set(union) == {f"split-{s}" for s in range(4)}
    rest = [e for k in range(3) for e in await drain(src, ctx(k, 3), union, 256)]
    assert sorted(e["seq"] for e in first + rest) == list(range(5000))


async def test_unbounded_never_ends_and_padding() -> None:
    src = GeneratorSource(None, event_size=10)
    assert not src.bounded
    r = src.create_reader(ctx())
    await r.start({"split-0": 10**9})
    b = await r.read_batch(3)
    assert b is not None and [e["seq"] for e in b] == [10**9, 10**9 + 1, 10**9 + 2]
    assert b[0]["pad"] == "x" * 10


async def test_skew_concentrates_on_low_ranks() -> None:
    events = GeneratorSource(None, keys=100, skew=1.5).generate(0, 0, 20_000)
    top = sum(e["app_id"] == "app-0" for e in events)
    assert top > 20_000 * 0.25  # uniform would give ~1%


async def test_rate_paces_with_the_injected_clock() -> None:
    clock = ManualClock()
    src = GeneratorSource(None, rate=100.0, splits=1)
    r = src.create_reader(ctx(clock=clock))
    await r.start(None)
    task = asyncio.ensure_future(r.read_batch(1000))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()  # nothing is due at t=0
    clock.advance(0.05)
    for _ in range(5):
        await asyncio.sleep(0)
    assert task.done()
    assert len(task.result() or []) == 5
    clock.advance(1.0)
    b = await r.read_batch(1000)
    assert b is not None and len(b) == 100


def test_write_generated_jsonl_matches_generator(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    write_generated_jsonl(path, 5000, seed=2, keys=10, skew=0.5)
    lines = path.read_bytes().splitlines()
    expected = GeneratorSource(5000, seed=2, keys=10, skew=0.5).generate(0, 0, 5000)
    assert [orjson.loads(x) for x in lines] == expected


def test_invalid_config() -> None:
    with pytest.raises(ConfigError):
        GeneratorSource(-1)
    with pytest.raises(ConfigError):
        GeneratorSource(10, rate=0)
    with pytest.raises(ConfigError):
        GeneratorSource(10, keys=0)
