"""The first checkpoint after a restore references the restored chain: no copy of unchanged data.

Before, a restored instance had no base, so its first checkpoint copied the
whole state again (1 M keys: a 37 MB full file) although the restored files
held it. Like Flink's incremental checkpoints after a restore, it now writes
only what changed since (or nothing), when the working copy is exactly one
restored chain in this storage's shared directory. A savepoint (which must
stay self-contained), a checkpoint of another directory, or several handles
(another parallelism) still give a full copy.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.checkpoint.storage import CheckpointStorage
from aiostream_ckpt.state.backend import StateHandle
from aiostream_ckpt.state.descriptors import MapStateDescriptor, ValueStateDescriptor
from aiostream_ckpt.state.lmdb import LmdbStateBackend
from tests.helpers import completed_checkpoint
from tests.unit.state.conftest import Env

KEYS = 400


def _filled(env: Env, **kw: Any) -> tuple[LmdbStateBackend, Any, Any]:
    b = env.backend(**kw)
    v = b.create_state(ValueStateDescriptor("v"))
    m = b.create_state(MapStateDescriptor("m"))
    for k in range(KEYS):
        b.key_context.key = k
        v.update(k)
        m.put("a", k)
    return b, v, m


def _restored(env: Env, root: Path, handles: list[StateHandle], **kw: Any) -> Any:
    r = env.backend(**kw)
    r.restore(root, handles)
    return r, r.create_state(ValueStateDescriptor("v")), r.create_state(MapStateDescriptor("m"))


def _dump(env: Env, root: Path, handle: StateHandle) -> dict[str, dict[Any, Any]]:
    r, v, m = _restored(env, root, [handle])
    return env.dump(r, {"v": v, "m": m})


def test_first_checkpoint_after_restore_writes_only_the_changes(env: Env) -> None:
    b, v, m = _filled(env)
    base = env.checkpoint(b, 1)
    b.key_context.key = 1
    v.update(-1)
    restored_from = env.checkpoint(b, 2)  # [full, (tail,) delta]: referenced whole
    assert restored_from["kind"] == "incremental"
    b.close()

    r, v, m = _restored(env, env.root, [restored_from])
    for k in (3, 4):
        r.key_context.key = k
        v.update(-k)
    r.key_context.key = 5
    v.clear()
    m.remove("a")
    first = env.checkpoint(r, 3)
    assert first["kind"] == "incremental", "a full copy of the restored state"
    assert first["chain"][:-1] == restored_from["chain"]  # and one new delta file
    assert first["chain"][0] == base["chain"][0]  # the full file of checkpoint 1, as is
    assert first["delta_records"] == 4  # 2 updates, a value and a map entry deleted
    assert first["size_bytes"] < base["size_bytes"] // 20
    want_v = {k: k for k in range(KEYS)} | {1: -1, 3: -3, 4: -4}
    del want_v[5]
    want_m = {k: {"a": k} for k in range(KEYS) if k != 5}
    assert _dump(env, env.root, first) == {"v": want_v, "m": want_m}


def test_an_idle_instance_after_restore_references_the_restored_checkpoint(env: Env) -> None:
    b, _, _ = _filled(env)
    restored_from = env.checkpoint(b, 1)
    b.close()
    r, _, _ = _restored(env, env.root, [restored_from])
    files = sorted(p.name for p in (env.root / "shared").iterdir())
    idle = env.checkpoint(r, 2)
    assert idle["chain"] == restored_from["chain"]
    assert (idle["size_bytes"], idle["unchanged_since"]) == (0, 1)
    assert sorted(p.name for p in (env.root / "shared").iterdir()) == files


def test_the_restored_chain_still_counts_toward_full_every(env: Env) -> None:
    b, v, _ = _filled(env, full_checkpoint_every=2)
    env.checkpoint(b, 1)
    b.key_context.key = 0
    v.update(-1)
    restored_from = env.checkpoint(b, 2)  # [full, delta]: a full one is due next
    b.close()
    r, v, _ = _restored(env, env.root, [restored_from], full_checkpoint_every=2)
    r.key_context.key = 0
    v.update(-2)
    assert env.checkpoint(r, 3)["kind"] == "full"


def test_a_savepoint_another_directory_or_parallelism_gives_a_full_copy(env: Env) -> None:
    b, _, _ = _filled(env)
    savepoint = env.checkpoint(b, 1, savepoint=True)
    chk = env.checkpoint(b, 2)
    b.close()
    r, _, _ = _restored(env, env.root, [savepoint])
    assert env.checkpoint(r, 3)["kind"] == "full"  # savepoint files are never referenced

    elsewhere = env.tmp / "copied"
    shutil.copytree(env.root, elsewhere)  # `--from-checkpoint` of another job's directory
    r, _, _ = _restored(env, elsewhere, [chk])
    assert env.checkpoint(r, 4)["kind"] == "full"

    two = [env.backend(index=i, parallelism=2) for i in range(2)]
    halves = []
    for h in two:
        h.restore(env.root, [chk])
        h.create_state(ValueStateDescriptor("v"))
        halves.append(env.checkpoint(h, 5))
    assert [h["kind"] for h in halves] == ["full", "full"]  # scale-up: a subset of a file
    one = env.backend()
    one.restore(env.root, halves)  # scale-down: two chains into one working copy
    one.create_state(ValueStateDescriptor("v"))
    assert env.checkpoint(one, 6)["kind"] == "full"


def test_a_pickled_state_converted_after_restore_is_in_the_first_delta(env: Env) -> None:
    b = env.backend()
    p = b.create_state(ValueStateDescriptor("p", serializer="pickle"))
    for k in range(50):
        b.key_context.key = k
        p.update({"n": k})
    restored_from = env.checkpoint(b, 1)
    conv = env.backend(allow_pickle=True)
    conv.restore(env.root, [restored_from])
    conv.create_state(ValueStateDescriptor("p", dict[str, int]))  # rewrites every value
    first = env.checkpoint(conv, 2)
    assert first["kind"] == "incremental" and first["delta_records"] == 50
    strict = env.backend()  # no allow_pickle: every value must be json now
    strict.restore(env.root, [first])
    v = strict.create_state(ValueStateDescriptor("p", dict[str, int]))
    assert env.dump(strict, {"p": v})["p"] == {k: {"n": k} for k in range(50)}


def _metadata(storage: CheckpointStorage, cid: int, handle: StateHandle) -> CompletedCheckpoint:
    chk = completed_checkpoint("op", 1, {0: {"subtask": 0, "parallelism": 1, "keyed": handle}})
    where = storage.checkpoint_dir(cid)
    return replace(chk, checkpoint_id=cid, is_savepoint=False, directory=where, root=storage.root)


def test_retention_keeps_the_restored_files_the_new_checkpoints_reference(env: Env) -> None:
    storage = CheckpointStorage(env.tmp / "ckpt")

    def complete(b: LmdbStateBackend, cid: int) -> StateHandle:
        handle = env.finish(b.snapshot(storage.target(cid, "op", 0)))
        storage.write_completed(_metadata(storage, cid, handle))
        b.notify_checkpoint_complete(cid)
        storage.apply_retention(1)
        return handle

    b, v, _ = _filled(env)
    restored_from = complete(b, 1)
    b.close()  # the process is gone: only the metadata protects the files
    r, v, _ = _restored(env, storage.root, [restored_from])
    r.key_context.key = 7
    v.update(-7)
    part = r.snapshot(storage.target(2, "op", 0))
    storage.apply_retention(1)  # e.g. another checkpoint completing: the base is pinned
    storage.discard(1)  # even with checkpoint 1 gone
    storage.apply_retention(1)
    first = env.finish(part)
    assert first["chain"][0] == restored_from["chain"][0]
    storage.write_completed(_metadata(storage, 2, first))
    r.notify_checkpoint_complete(2)
    storage.apply_retention(1)
    r.key_context.key = 8
    v.update(-8)
    second = complete(r, 3)
    assert second["chain"][0] == restored_from["chain"][0]
    assert not storage.checkpoint_dir(1).exists()
    r.close()
    CheckpointStorage(storage.root).apply_retention(1)  # no pins left
    want = {k: k for k in range(KEYS)} | {7: -7, 8: -8}
    assert _dump(env, storage.root, second)["v"] == want
