"""A savepoint's own copy of the output it lists as pre-committed (``connectors.held_output``).

The writers here go through the cycle the runtime drives (recover, write,
prepare_commit, hold_for_savepoint, commit), with the state round-tripped as
JSON the way checkpoint metadata carries it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt.connectors.base import ConnectorContext, RestoreInfo, SavepointHolder
from aiostream_ckpt.connectors.files import (
    DeadLetterWriter,
    ExactlyOnceFileSink,
    merge_writer_states,
    read_committed_output,
)
from aiostream_ckpt.connectors.staging import StagedFileWriter
from aiostream_ckpt.errors import ConnectorError


def restore_of(kind: str, cid: int, path: Path) -> RestoreInfo:
    return RestoreInfo(kind, cid, str(path), f"tag-{kind}-{cid}")


async def writer(
    d: Path,
    restored: Any = None,
    cid: int | None = None,
    *,
    restore: RestoreInfo | None = None,
    subtask: int = 0,
    parallelism: int = 1,
) -> StagedFileWriter:
    ctx = ConnectorContext("job", "sink", subtask, parallelism, restore=restore)
    w = ExactlyOnceFileSink(d).create_writer(ctx)
    await w.recover(restored, cid)
    return w


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    return orjson.loads(orjson.dumps(state))  # type: ignore[no-any-return]


def committed(d: Path) -> list[Any]:
    return list(read_committed_output(d))


async def savepoint(w: StagedFileWriter, cid: int, sp: Path, uid: str = "sink") -> dict[str, Any]:
    state = await w.prepare_commit(cid)
    held = f"{uid}-{w.subtask}/held-writer"
    return roundtrip(await w.hold_for_savepoint(cid, state, sp / held, sp))


async def killed_after_savepoint(out: Path, sp: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Checkpoint 1 completes, savepoint 2 is taken, the job dies; the states of 1 and 2."""
    w = await writer(out)
    await w.write([{"n": 1}])
    chk1 = roundtrip(await w.prepare_commit(1))
    await w.commit(1)
    await w.write([{"n": 2}, {"n": 3}])
    sp2 = await savepoint(w, 2, sp)
    await w.write([{"n": "after the savepoint"}])
    await w.close()
    return chk1, sp2


async def test_the_savepoint_links_what_it_lists_into_itself(tmp_path: Path) -> None:
    out, sp = tmp_path / "out", tmp_path / "sp"
    w = await writer(out)
    assert isinstance(w, SavepointHolder)
    await w.write([{"n": 1}])
    state = await savepoint(w, 5, sp)
    [[staged, path, size, sha]] = state["held"]
    assert staged == ".part-0000-0000000005.pending"
    assert path == "sink-0/held-writer/part-0000000005-0000.jsonl"
    copy = sp / path
    assert copy.read_bytes() == b'{"n":1}\n' and size == 8 and len(sha) == 64
    assert os.stat(copy).st_ino == os.stat(out / staged).st_ino  # a link, no bytes copied
    await w.commit(5)  # the next checkpoint commits it: the copy stays as it was
    assert committed(out) == [{"n": 1}] and copy.read_bytes() == b'{"n":1}\n'


async def test_a_restart_before_the_next_checkpoint_leaves_the_savepoint_restorable(
    tmp_path: Path,
) -> None:
    """The issue's case: the restart of checkpoint 1 aborts what savepoint 2 listed."""
    out, sp = tmp_path / "out", tmp_path / "sp"
    chk1, sp2 = await killed_after_savepoint(out, sp)
    # the restart goes back to checkpoint 1 and discards savepoint 2's staged file
    restarted = await writer(out, chk1, 1, restore=restore_of("checkpoint", 1, tmp_path))
    assert not list(out.glob(".part-*"))
    await restarted.write([{"n": 2}, {"n": 3}])
    await restarted.prepare_commit(3)
    await restarted.commit(3)
    await restarted.close()
    assert committed(out) == [{"n": 1}, {"n": 2}, {"n": 3}]
    # later the savepoint is restored into the same directory: its copy stands in
    restore = restore_of("savepoint", 2, sp)
    probe = ExactlyOnceFileSink(out).create_writer(
        ConnectorContext("job", "sink", 0, 1, restore=restore)
    )
    survey = probe.survey(sp2, 2)
    assert survey.lost == [] and [n for n, _ in survey.retract] == ["part-0000000003-0000.jsonl"]
    await writer(out, sp2, 2, restore=restore)
    assert committed(out) == [{"n": 1}, {"n": 2}, {"n": 3}]  # 3 retracted, 2 back
    assert sorted(p.name for p in out.glob("part-*")) == [
        "part-0000000001-0000.jsonl",
        "part-0000000002-0000.jsonl",
    ]


async def test_a_missing_or_changed_copy_is_lost_and_says_why(tmp_path: Path) -> None:
    out, sp = tmp_path / "out", tmp_path / "sp"
    chk1, sp2 = await killed_after_savepoint(out, sp)
    await writer(out, chk1, 1)  # aborts the staged file
    restore = restore_of("savepoint", 2, sp)
    copy = sp / sp2["held"][0][1]
    os.unlink(copy)  # break the link: changing it must not change the output directory
    copy.write_bytes(b'{"n":2}\n{"n":4}\n')
    probe = ExactlyOnceFileSink(out).create_writer(
        ConnectorContext("job", "sink", 0, 1, restore=restore)
    )
    [lost] = probe.survey(sp2, 2).lost
    assert lost.startswith(".part-0000-0000000002.pending (") and "sha256" in lost
    copy.unlink()
    [lost] = probe.survey(sp2, 2).lost
    assert "is missing" in lost
    with pytest.raises(ConnectorError, match="never committed"):
        await writer(out, sp2, 2, restore=restore)


async def test_a_copy_counts_only_when_restoring_the_savepoint(tmp_path: Path) -> None:
    """A checkpoint's restore (no savepoint path to resolve copies in) calls it lost."""
    out, sp = tmp_path / "out", tmp_path / "sp"
    chk1, sp2 = await killed_after_savepoint(out, sp)
    await writer(out, chk1, 1)
    probe = ExactlyOnceFileSink(out).create_writer(
        ConnectorContext("job", "sink", 0, 1, restore=restore_of("checkpoint", 2, sp))
    )
    assert probe.survey(sp2, 2).lost == [".part-0000-0000000002.pending"]


async def test_a_file_committed_meanwhile_is_held_under_its_committed_name(
    tmp_path: Path,
) -> None:
    """The copy is taken after the barrier: a commit of an earlier checkpoint may run first."""
    out, sp = tmp_path / "out", tmp_path / "sp"
    w = await writer(out)
    await w.write([{"n": 1}])
    await w.prepare_commit(1)  # checkpoint 1 still pending at the savepoint's barrier
    await w.write([{"n": 2}])
    state = await w.prepare_commit(2)
    await w.commit(1)  # checkpoint 1 completes before the savepoint's copy is taken
    held = roundtrip(await w.hold_for_savepoint(2, state, sp / "sink-0/held-writer", sp))
    assert sorted(Path(p).name for _, p, _, _ in held["held"]) == [
        "part-0000000001-0000.jsonl",
        "part-0000000002-0000.jsonl",
    ]
    assert (sp / held["held"][0][1]).read_bytes() == b'{"n":1}\n'


async def test_across_filesystems_the_copy_is_a_byte_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, sp = tmp_path / "out", tmp_path / "sp"
    link = os.link

    def no_link(src: Any, dst: Any) -> None:  # the savepoint on another filesystem
        if str(sp) in f"{src} {dst}":
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        link(src, dst)

    monkeypatch.setattr(os, "link", no_link)
    chk1, sp2 = await killed_after_savepoint(out, sp)
    copy = sp / sp2["held"][0][1]
    assert copy.read_bytes() == b'{"n":2}\n{"n":3}\n'
    assert not list(copy.parent.glob(".*.tmp"))
    await writer(out, chk1, 1)
    await writer(out, sp2, 2, restore=restore_of("savepoint", 2, sp))
    assert committed(out) == [{"n": 1}, {"n": 2}, {"n": 3}]


async def test_rescaled_restore_brings_each_copy_back_once(tmp_path: Path) -> None:
    out, sp = tmp_path / "out", tmp_path / "sp"
    ws = [await writer(out, subtask=k, parallelism=3) for k in range(3)]
    states = []
    for k, w in enumerate(ws):
        await w.write([{"k": k}])
        states.append(await savepoint(w, 4, sp))
        await w.close()
    for k in range(3):  # a restart to before the savepoint discards its files
        await writer(out, None, 0, subtask=k, parallelism=3)
    assert not list(out.glob(".part-*"))
    merged = merge_writer_states(states)
    assert len(merged["held"]) == 3
    restore = restore_of("savepoint", 4, sp)
    for k in range(2):  # parallelism 3 -> 2: subtask 0 answers for old subtask 2
        await writer(out, roundtrip(merged), 4, restore=restore, subtask=k, parallelism=2)
    assert sorted(r["k"] for r in committed(out)) == [0, 1, 2]


async def test_dead_letters_are_held_too(tmp_path: Path) -> None:
    d, sp = tmp_path / "dead", tmp_path / "sp"
    w = DeadLetterWriter(d, 0)
    await w.recover(None, None)
    w.add(b"not json", "malformed", {"file": "x", "line": 1})
    state = await w.prepare_commit(3)
    held = await w.hold_for_savepoint(3, state, sp / "events-0/held-dead_letter", sp)
    assert [Path(p).name for _, p, _, _ in held["held"]] == ["dead-letter-0000000003-0000.jsonl"]


async def test_an_empty_epoch_holds_nothing(tmp_path: Path) -> None:
    out, sp = tmp_path / "out", tmp_path / "sp"
    w = await writer(out)
    state = await w.prepare_commit(1)
    assert await w.hold_for_savepoint(1, state, sp / "sink-0/held-writer", sp) == state
    assert not sp.exists()
