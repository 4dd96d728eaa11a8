from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.files import JsonLinesFileReader, JsonLinesFileSource
from aiostream_ckpt.errors import ConfigError, ConnectorError, RecordError
from tests.helpers import wait_until


def ctx(subtask: int = 0, parallelism: int = 1, dead: list[Any] | None = None) -> ConnectorContext:
    c = ConnectorContext("job", "src", subtask, parallelism)
    if dead is not None:
        c.dead_letter = lambda raw, reason, origin: dead.append((raw, reason, origin))
    return c


def write_lines(path: Path, records: list[Any], *, trailing_newline: bool = True) -> Path:
    data = b"\n".join(orjson.dumps(r) for r in records)
    path.write_bytes(data + (b"\n" if trailing_newline else b""))
    return path


async def drain(reader: JsonLinesFileReader, batch: int) -> list[Any]:
    out: list[Any] = []
    while (b := await reader.read_batch(batch)) is not None:
        assert len(b) <= batch
        out.extend(b)
    return out


async def open_reader(
    src: JsonLinesFileSource, c: ConnectorContext, restored: Any = None
) -> JsonLinesFileReader:
    r = src.create_reader(c)
    await r.start(restored)
    return r


@pytest.mark.parametrize("block_size", [1, 7, 64, 1 << 20])
@pytest.mark.parametrize("trailing_newline", [True, False])
async def test_offsets_exact_across_batches_and_blocks(
    tmp_path: Path, block_size: int, trailing_newline: bool
) -> None:
    records = [{"i": i, "s": "x" * (i % 13)} for i in range(50)]
    path = write_lines(tmp_path / "a.jsonl", records, trailing_newline=trailing_newline)
    data = path.read_bytes()
    src = JsonLinesFileSource(path, block_size=block_size)
    r = await open_reader(src, ctx())
    seen: list[Any] = []
    while (b := await r.read_batch(3)) is not None:
        seen.extend(b)
        pos = r.snapshot_position()[str(path.resolve())]
        # The offset is right after the last returned line (and its newline, if any).
        consumed = b"\n".join(orjson.dumps(x) for x in seen)
        expected = len(consumed) + (1 if len(seen) < len(records) or trailing_newline else 0)
        assert pos == expected
    assert seen == records
    assert r.snapshot_position() == {str(path.resolve()): len(data)}
    assert await r.read_batch(3) is None


async def test_replay_from_every_snapshot_gives_the_rest(tmp_path: Path) -> None:
    records = [{"i": i} for i in range(40)]
    path = write_lines(tmp_path / "a.jsonl", records, trailing_newline=False)
    src = JsonLinesFileSource(path, block_size=16)
    r = await open_reader(src, ctx())
    done = 0
    while (b := await r.read_batch(7)) is not None:
        done += len(b)
        snap = r.snapshot_position()
        replay = await open_reader(src, ctx(), orjson.loads(orjson.dumps(snap)))
        assert await drain(replay, 5) == records[done:]


async def test_malformed_lines_dead_lettered_with_offsets(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    data = b'{"i": 0}\n{broken\n\n   \n{"i": 1}\r\n[1, 2\n{"i": 2}'
    path.write_bytes(data)
    dead: list[Any] = []
    r = await open_reader(JsonLinesFileSource(path, block_size=5), ctx(dead=dead))
    assert await drain(r, 100) == [{"i": 0}, {"i": 1}, {"i": 2}]
    f = str(path.resolve())
    assert [(raw, origin) for raw, _, origin in dead] == [
        (b"{broken", {"file": f, "offset": data.index(b"{broken")}),
        (b"[1, 2", {"file": f, "offset": data.index(b"[1, 2")}),
    ]
    assert all("invalid JSON" in reason for _, reason, _ in dead)


@pytest.mark.parametrize("block_size", [3, 16, 1 << 20])
async def test_offsets_exact_after_restore_mid_block(tmp_path: Path, block_size: int) -> None:
    """Positions are worked out from the block's start: a restored reader starts mid-file."""
    path = tmp_path / "a.jsonl"
    lines = [b'{"i": %d}' % i if i % 5 else b"{bad %d" % i for i in range(30)]
    data = b"\n".join(lines)  # no trailing newline: the last line ends the file
    path.write_bytes(data)
    f = str(path.resolve())
    start = data.index(b'{"i": 7}')
    dead: list[Any] = []
    src = JsonLinesFileSource(path, block_size=block_size, with_position=True)
    r = await open_reader(src, ctx(dead=dead), {f: start})
    seen: list[Any] = []
    while (b := await r.read_batch(4)) is not None:
        seen.extend(b)
        # A full batch ends on a returned line (a dead line leaves the batch short).
        end = data.find(b"\n", seen[-1]["_pos"][1]) + 1 or len(data)
        assert r.snapshot_position()[f] == end
    assert [e["i"] for e in seen] == [i for i in range(7, 30) if i % 5]
    assert [e["_pos"][1] for e in seen] == [data.index(b'{"i": %d}' % e["i"]) for e in seen]
    assert [(raw, d["offset"]) for raw, _, d in dead] == [
        (b"{bad %d" % i, data.index(b"{bad %d" % i)) for i in (10, 15, 20, 25)
    ]
    assert r.snapshot_position() == {f: len(data)}


async def test_fail_fast_dead_letter_propagates(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"i": 0}\nnope\n')
    r = await open_reader(JsonLinesFileSource(path), ctx())  # default dead letter raises
    with pytest.raises(RecordError, match="offset"):
        await r.read_batch(10)


async def test_with_position_and_raw_modes(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"i": 0}\n\n{"i": 1}\n7\n')
    f = str(path.resolve())
    dead: list[Any] = []
    r = await open_reader(JsonLinesFileSource(path, with_position=True), ctx(dead=dead))
    assert await drain(r, 10) == [{"i": 0, "_pos": [f, 0]}, {"i": 1, "_pos": [f, 10]}]
    assert [(raw, reason) for raw, reason, _ in dead] == [(b"7", "not a JSON object")]
    raw = await open_reader(JsonLinesFileSource(path, parse=False), ctx())
    assert await drain(raw, 10) == [b'{"i": 0}', b'{"i": 1}', b"7"]
    with pytest.raises(ConfigError):
        JsonLinesFileSource(path, parse=False, with_position=True)


async def test_parallel_readers_split_files_and_restore_union(tmp_path: Path) -> None:
    files = [
        write_lines(tmp_path / f"f{n}.jsonl", [{"f": n, "i": i} for i in range(10)])
        for n in range(5)
    ]
    src = JsonLinesFileSource(tmp_path)  # a directory stands for its files, sorted
    assert src.splits == [str(p.resolve()) for p in files]

    readers = [await open_reader(src, ctx(k, 2)) for k in range(2)]
    firsts = [await r.read_batch(4) for r in readers]
    assert {e["f"] for e in firsts[0] or []} == {0}
    assert {e["f"] for e in firsts[1] or []} == {1}
    union: dict[str, Any] = {}
    for r in readers:
        union.update(r.snapshot_position())
    assert set(union) == set(src.splits)

    # Restore at parallelism 3: every instance takes its own splits' positions.
    restored = [await open_reader(src, ctx(k, 3), union) for k in range(3)]
    rest = [e for r in restored for e in await drain(r, 3)]
    got = sorted((e["f"], e["i"]) for e in [*(firsts[0] or []), *(firsts[1] or []), *rest])
    assert got == [(f, i) for f in range(5) for i in range(10)]


async def test_reader_without_splits_ends_at_once(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "a.jsonl", [{"i": 1}])
    r = await open_reader(JsonLinesFileSource(path), ctx(1, 2))
    assert await r.read_batch(10) is None
    assert r.snapshot_position() == {}


async def test_empty_file_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"")
    r = await open_reader(JsonLinesFileSource(tmp_path / "empty.jsonl"), ctx())
    assert await r.read_batch(10) is None
    r = await open_reader(JsonLinesFileSource(tmp_path / "missing.jsonl"), ctx())
    with pytest.raises(ConnectorError, match="cannot open"):
        await r.read_batch(10)


async def test_restored_position_beyond_file_is_an_error(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "a.jsonl", [{"i": 1}])
    src = JsonLinesFileSource(path)
    r = await open_reader(src, ctx(), {str(path.resolve()): 10_000})
    with pytest.raises(ConnectorError, match="shorter"):
        await r.read_batch(10)


async def test_replay_does_not_report_consumed_malformed_lines_again(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"i": 0}\nbad\n{"i": 1}\n')
    dead: list[Any] = []
    src = JsonLinesFileSource(path)
    r = await open_reader(src, ctx(dead=dead))
    assert await r.read_batch(1) == [{"i": 0}]
    assert await r.read_batch(1) == [{"i": 1}]
    assert len(dead) == 1
    replay = await open_reader(src, ctx(dead=dead), r.snapshot_position())
    assert await drain(replay, 10) == []
    assert len(dead) == 1


async def test_required_fields_dead_letter_with_offsets(tmp_path) -> None:
    from aiostream_ckpt.connectors.base import ConnectorContext
    from aiostream_ckpt.connectors.files import JsonLinesFileSource

    lines = [b'{"app_id": "a"}', b'{"user": 1}', b'{"app_id": 5}', b"[1, 2]", b'{"app_id": "b"}']
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    dead: list[tuple[bytes, str, dict]] = []
    ctx = ConnectorContext("j", "src", 0, 1, dead_letter=lambda r, why, o: dead.append((r, why, o)))
    reader = JsonLinesFileSource(path, required={"app_id": str}).create_reader(ctx)
    await reader.start(None)
    events = await reader.read_batch(100)
    assert events == [{"app_id": "a"}, {"app_id": "b"}]
    offsets = [len(b"\n".join(lines[:i])) + (1 if i else 0) for i in range(len(lines))]
    assert [(r, o["offset"]) for r, _, o in dead] == [
        (lines[1], offsets[1]),
        (lines[2], offsets[2]),
        (lines[3], offsets[3]),
    ]
    assert dead[0][1] == "field 'app_id' must be str, got NoneType"
    assert dead[2][1] == "not a JSON object"


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (b'{"user": 1, "n": 0}', "field 'app_id' must be str, got NoneType"),
        (b'{"app_id": 5, "n": 0}', "field 'app_id' must be str, got int"),
        (b'{"app_id": null, "n": 0}', "field 'app_id' must be str, got NoneType"),
        (b'{"app_id": ["a"], "n": 0}', "field 'app_id' must be str, got list"),
        (b'{"app_id": true, "n": 0}', "field 'app_id' must be str, got bool"),
        (b'["app_id"]', "not a JSON object"),
        (b'"app_id"', "not a JSON object"),
        (b"7", "not a JSON object"),
        (b'{"app_id": "a"}', "field 'n' must be int, got NoneType"),
        (b'{"app_id": "a", "n": 1.5}', "field 'n' must be int, got float"),
        (b'{"app_id": "a", "n": false}', "field 'n' must be int, got bool"),
    ],
)
async def test_one_bad_event_in_a_good_batch_is_caught(
    tmp_path: Path, bad: bytes, reason: str
) -> None:
    """The batch-wide check (C-level maps) misses no single bad event of any kind."""
    good = [b'{"app_id": "k%d", "n": %d}' % (i, i) for i in range(20)]
    lines = [*good[:11], bad, *good[11:]]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    dead: list[Any] = []
    src = JsonLinesFileSource(path, required={"app_id": str, "n": int})
    r = await open_reader(src, ctx(dead=dead))
    assert await drain(r, 100) == [orjson.loads(ln) for ln in good]
    assert [(raw, why) for raw, why, _ in dead] == [(bad, reason)]


async def test_rate_paces_each_reader_with_the_injected_clock(tmp_path: Path) -> None:
    """A paced reader lets ``rate`` records out per second of its clock, whatever the machine."""
    path = write_lines(tmp_path / "a.jsonl", [{"i": i} for i in range(300)])
    clock = ManualClock()
    c = ctx()
    c.clock = clock
    r = await open_reader(JsonLinesFileSource(path, rate=100.0), c)
    task = asyncio.ensure_future(r.read_batch(1000))
    await wait_until(lambda: clock.sleepers == 1)  # nothing is due at t=0: it waits
    clock.advance(0.05)
    assert [e["i"] for e in await task or []] == [0, 1, 2, 3, 4]
    clock.advance(1.0)
    assert [e["i"] for e in await r.read_batch(1000) or []] == list(range(5, 105))
    read = sum(len(orjson.dumps({"i": i})) + 1 for i in range(105))
    assert r.snapshot_position() == {str(path.resolve()): read}
    clock.advance(10.0)
    assert len(await drain(r, 1000)) == 195
    with pytest.raises(ConfigError):
        JsonLinesFileSource(path, rate=0)
