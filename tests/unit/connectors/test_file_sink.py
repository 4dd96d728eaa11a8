from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.files import (
    DeadLetterWriter,
    ExactlyOnceFileSink,
    merge_writer_states,
    read_committed_output,
)
from aiostream_ckpt.connectors.output_recovery import LOCATION_FILE, read_location
from aiostream_ckpt.connectors.staging import StagedFileWriter, committed_files
from aiostream_ckpt.errors import ConnectorError


def ctx(subtask: int = 0, parallelism: int = 1, attempt: int = 0) -> ConnectorContext:
    return ConnectorContext("job", "sink", subtask, parallelism, attempt=attempt)


async def writer(
    d: Path, restored: Any = None, cid: int | None = None, *, subtask: int = 0, parallelism: int = 1
) -> StagedFileWriter:
    w = ExactlyOnceFileSink(d).create_writer(ctx(subtask, parallelism))
    await w.recover(restored, cid)
    return w


def listing(d: Path) -> list[str]:
    """Output and staged files (the hidden location marker is neither)."""
    return sorted(n for n in os.listdir(d) if n != LOCATION_FILE)


def committed(d: Path) -> list[Any]:
    return list(read_committed_output(d))


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    """State goes through checkpoint metadata as JSON."""
    return orjson.loads(orjson.dumps(state))  # type: ignore[no-any-return]


async def test_prepare_then_commit_makes_output_visible(tmp_path: Path) -> None:
    w = await writer(tmp_path)
    await w.write([{"a": 1}, {"a": 2}])
    await w.write([])
    assert committed(tmp_path) == []
    state = await w.prepare_commit(1)
    assert state == {
        "pending": [[".part-0000-0000000001.pending", "part-0000000001-0000.jsonl"]],
        "location": read_location(tmp_path),
    }
    assert committed(tmp_path) == []
    await w.commit(1)
    await w.commit(1)  # idempotent
    assert committed(tmp_path) == [{"a": 1}, {"a": 2}]
    assert listing(tmp_path) == ["part-0000000001-0000.jsonl"]
    # An epoch without records creates no file.
    assert await w.prepare_commit(2) == {"pending": [], "location": read_location(tmp_path)}
    await w.commit(2)
    assert listing(tmp_path) == ["part-0000000001-0000.jsonl"]


async def test_crash_between_prepare_and_commit_is_committed_by_recovery(tmp_path: Path) -> None:
    w = await writer(tmp_path)
    await w.write([{"a": 1}])
    state = roundtrip(await w.prepare_commit(1))
    await w.write([{"a": "after barrier"}])  # in progress when the process dies
    await w.close()
    assert committed(tmp_path) == []

    w2 = await writer(tmp_path, state, 1)
    assert committed(tmp_path) == [{"a": 1}]
    assert listing(tmp_path) == ["part-0000000001-0000.jsonl"]  # in-progress file discarded
    # Recovering again with the same state (a second crash) is harmless.
    await w2.close()
    await writer(tmp_path, state, 1)
    assert committed(tmp_path) == [{"a": 1}]


async def test_aborted_checkpoint_is_carried_into_the_next(tmp_path: Path) -> None:
    w = await writer(tmp_path)
    await w.write([{"n": 1}])
    await w.prepare_commit(1)  # checkpoint 1 is then aborted: no commit(1)
    await w.write([{"n": 2}])
    state = roundtrip(await w.prepare_commit(2))
    assert [staged for staged, _ in state["pending"]] == [
        ".part-0000-0000000001.pending",
        ".part-0000-0000000002.pending",
    ]
    # Crash before commit(2): recovery from checkpoint 2 commits both.
    await w.close()
    await writer(tmp_path, state, 2)
    assert committed(tmp_path) == [{"n": 1}, {"n": 2}]


async def test_commit_only_up_to_the_completed_checkpoint(tmp_path: Path) -> None:
    w = await writer(tmp_path)
    await w.write([{"n": 1}])
    await w.prepare_commit(1)
    await w.write([{"n": 2}])
    state2 = await w.prepare_commit(2)
    await w.commit(1)  # checkpoint 2's notification has not arrived yet
    assert committed(tmp_path) == [{"n": 1}]
    assert len(state2["pending"]) == 2
    assert (await w.prepare_commit(3))["pending"] == [
        [".part-0000-0000000002.pending", "part-0000000002-0000.jsonl"]
    ]
    await w.commit(3)
    assert committed(tmp_path) == [{"n": 1}, {"n": 2}]


async def test_recover_discards_staged_files_of_unfinished_checkpoints(tmp_path: Path) -> None:
    w = await writer(tmp_path)
    await w.write([{"n": 1}])
    s1 = roundtrip(await w.prepare_commit(1))
    await w.commit(1)
    await w.write([{"n": 2}])
    await w.prepare_commit(2)  # checkpoint 2 never completes
    await w.write([{"n": 3}])
    await w.close()
    # what a killed subtask 1 leaves behind (close() would have discarded it)
    (tmp_path / ".part-0001-a0-1.inprogress").write_bytes(b'{"other": 1}\n')
    before = listing(tmp_path)
    assert ".part-0000-0000000002.pending" in before

    await writer(tmp_path, s1, 1, parallelism=2)
    after = listing(tmp_path)
    assert [n for n in after if n.startswith(".part-0000")] == []
    # Another subtask's staged files are its own business.
    assert any(n.startswith(".part-0001-") for n in after)
    assert committed(tmp_path) == [{"n": 1}]


async def test_state_of_another_location_means_a_fresh_output(tmp_path: Path) -> None:
    """A savepoint's writer state restored into a new directory or an emptied volume."""
    blue = tmp_path / "blue"
    w = await writer(blue)
    await w.write([{"n": 1}])
    state = roundtrip(await w.prepare_commit(1))
    await w.close()
    assert state["location"] == read_location(blue)
    for green in (tmp_path / "green", blue):
        if green == blue:  # a fresh volume mounted at the same path
            for p in blue.iterdir():
                p.unlink()
        fresh = ExactlyOnceFileSink(green).create_writer(ctx())
        survey = fresh.survey(state, 1)
        assert survey.lost == [] and survey.retract == []
        await fresh.recover(state, 1)
        assert read_location(green) not in (None, state["location"])
        assert committed(green) == []
    # the same location with its pre-committed file gone is a loss, not a fresh start
    w = await writer(tmp_path / "red")
    await w.write([{"n": 1}])
    state = roundtrip(await w.prepare_commit(1))
    await w.close()
    (tmp_path / "red" / ".part-0000-0000000001.pending").unlink()
    assert ExactlyOnceFileSink(tmp_path / "red").create_writer(ctx()).survey(state, 1).lost
    with pytest.raises(ConnectorError, match="records are lost"):
        await writer(tmp_path / "red", state, 1)


async def test_close_discards_the_open_transaction_only(tmp_path: Path) -> None:
    """A stopped writer leaves no hidden in-progress file; pre-committed ones stay listed."""
    w = await writer(tmp_path)
    await w.write([{"n": 1}])
    await w.prepare_commit(1)
    await w.write([{"n": 2}])
    await w.close()
    assert listing(tmp_path) == [".part-0000-0000000001.pending"]


async def test_recover_to_older_checkpoint_retracts_newer_committed_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Output committed after the restored checkpoint moves aside with a manifest, never deleted."""
    w = await writer(tmp_path)
    states = {}
    for cid in (1, 2, 3):
        await w.write([{"n": cid}, {"n": cid}])
        states[cid] = roundtrip(await w.prepare_commit(cid))
        await w.commit(cid)
    await w.close()
    with caplog.at_level(logging.WARNING):
        await writer(tmp_path, states[1], 1)  # checkpoints 2 and 3 turned out corrupt
    assert committed(tmp_path) == [{"n": 1}, {"n": 1}]
    assert "retracted 4 committed record(s) in 2 file(s) of checkpoint(s) 2, 3" in caplog.text
    [aside] = (tmp_path / "_retracted").iterdir()
    assert sorted(p.name for p in aside.iterdir()) == [
        "_manifest-part-0000.json",
        "part-0000000002-0000.jsonl",
        "part-0000000003-0000.jsonl",
    ]
    manifest = orjson.loads((aside / "_manifest-part-0000.json").read_bytes())
    assert [(e["file"], e["checkpoint"], e["records"]) for e in manifest["what"]] == [
        ("part-0000000002-0000.jsonl", 2, 2),
        ("part-0000000003-0000.jsonl", 3, 2),
    ]
    assert manifest["records"] == 4 and manifest["restored"]["id"] == 1
    assert "restored checkpoint 1" in manifest["why"]
    survey = ExactlyOnceFileSink(tmp_path).create_writer(ctx()).survey(states[1], 1)
    assert survey.retract == [] and survey.highest_id == 3, "retracted names stay used"


async def test_a_crash_in_the_middle_of_a_retraction_is_finished_by_the_next_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the manifest and one move: the next recovery moves the rest, loses nothing."""
    from aiostream_ckpt.connectors import output_recovery

    w = await writer(tmp_path)
    states = {}
    for cid in (1, 2, 3):
        await w.write([{"n": cid}])
        states[cid] = roundtrip(await w.prepare_commit(cid))
        await w.commit(cid)
    await w.close()
    real_rename, moves = os.rename, []

    def dying_rename(src: Any, dst: Any) -> None:
        if moves:
            raise KeyboardInterrupt("killed")  # stands in for SIGKILL: nothing after runs
        moves.append(src)
        real_rename(src, dst)

    monkeypatch.setattr(output_recovery.os, "rename", dying_rename)
    with pytest.raises(KeyboardInterrupt):
        await writer(tmp_path, states[1], 1)
    monkeypatch.setattr(output_recovery.os, "rename", real_rename)
    assert len(committed_files(tmp_path)) == 2, "one file moved, one still visible"
    await writer(tmp_path, states[1], 1)
    assert committed(tmp_path) == [{"n": 1}]
    moved = sorted(p.name for p in (tmp_path / "_retracted").rglob("part-*"))
    assert moved == ["part-0000000002-0000.jsonl", "part-0000000003-0000.jsonl"]
    manifests = list((tmp_path / "_retracted").rglob("_manifest-*.json"))
    assert len(manifests) == 2  # each attempt says what it set out to move


async def test_recover_fails_when_listed_file_is_gone(tmp_path: Path) -> None:
    w = await writer(tmp_path)
    await w.write([{"n": 1}])
    state = roundtrip(await w.prepare_commit(1))
    await w.close()
    (tmp_path / ".part-0000-0000000001.pending").unlink()
    with pytest.raises(ConnectorError, match=r"\.part-0000-0000000001\.pending") as err:
        await writer(tmp_path, state, 1)
    assert not err.value.retriable


async def test_fresh_start_refuses_directory_with_committed_output(tmp_path: Path) -> None:
    w = await writer(tmp_path)
    await w.write([{"n": 1}])
    await w.prepare_commit(1)
    await w.commit(1)
    await w.close()
    with pytest.raises(ConnectorError, match="already has committed output"):
        await writer(tmp_path)
    with pytest.raises(ConnectorError, match="already has committed output"):
        await writer(tmp_path, subtask=1, parallelism=2)


async def test_fresh_start_after_crash_before_first_checkpoint(tmp_path: Path) -> None:
    w = await writer(tmp_path)
    await w.write([{"n": 1}])
    await w.prepare_commit(1)
    await w.write([{"n": 2}])
    await w.close()
    w2 = await writer(tmp_path)
    assert listing(tmp_path) == []
    await w2.write([{"n": 3}])
    await w2.prepare_commit(1)
    await w2.commit(1)
    assert committed(tmp_path) == [{"n": 3}]


async def test_parallel_writers_and_commit_order(tmp_path: Path) -> None:
    ws = [await writer(tmp_path, subtask=k, parallelism=2) for k in range(2)]
    for cid in (1, 2):
        for k, w in reversed(list(enumerate(ws))):
            await w.write([{"k": k, "cid": cid}])
            await w.prepare_commit(cid)
        for w in ws:
            await w.commit(cid)
    assert committed(tmp_path) == [
        {"k": 0, "cid": 1},
        {"k": 1, "cid": 1},
        {"k": 0, "cid": 2},
        {"k": 1, "cid": 2},
    ]
    (tmp_path / "notes.txt").write_text("ignored")
    assert len(committed(tmp_path)) == 4


async def test_restore_at_lower_parallelism_with_merged_state(tmp_path: Path) -> None:
    ws = [await writer(tmp_path, subtask=k, parallelism=3) for k in range(3)]
    states = []
    for k, w in enumerate(ws):
        await w.write([{"k": k}])
        states.append(roundtrip(await w.prepare_commit(1)))
        await w.write([{"k": k, "late": True}])
        await w.close()
    merged = merge_writer_states(states)
    for k in range(2):  # parallelism 3 -> 2; every new writer gets the union
        await writer(tmp_path, merged, 1, subtask=k, parallelism=2)
    assert sorted(e["k"] for e in committed(tmp_path)) == [0, 1, 2]
    assert [n for n in listing(tmp_path) if n.startswith(".")] == []


async def test_writer_must_recover_first(tmp_path: Path) -> None:
    w = ExactlyOnceFileSink(tmp_path).create_writer(ctx())
    with pytest.raises(ConnectorError, match="before recover"):
        await w.write([{"n": 1}])


async def test_dead_letter_writer_commits_exactly_once(tmp_path: Path) -> None:
    dl = DeadLetterWriter(tmp_path, 0)
    await dl.recover(None, None)
    dl.add(b"{bad \xff", "invalid JSON", {"file": "/in.jsonl", "offset": 10})
    state = roundtrip(await dl.prepare_commit(1))
    dl.add("later", "invalid JSON", {"file": "/in.jsonl", "offset": 99})  # after the barrier
    await dl.close()
    # Crash before commit; recovery commits checkpoint 1's entry, drops the later one
    # (the source replays that line and reports it again).
    dl2 = DeadLetterWriter(tmp_path, 0)
    await dl2.recover(state, 1)
    out = list(read_committed_output(tmp_path, prefix="dead-letter"))
    origin = {"file": "/in.jsonl", "offset": 10}
    assert out == [{"reason": "invalid JSON", "origin": origin, "raw": "{bad \ufffd"}]
    assert committed(tmp_path) == []  # the sink's prefix sees nothing


async def test_duplicate_concurrent_commits_are_harmless(tmp_path: Path) -> None:
    w = await writer(tmp_path)
    await w.write([{"n": 1}])
    await w.prepare_commit(1)
    await asyncio.gather(w.commit(1), w.commit(1))
    assert committed(tmp_path) == [{"n": 1}]
    assert (await w.prepare_commit(2))["pending"] == []
