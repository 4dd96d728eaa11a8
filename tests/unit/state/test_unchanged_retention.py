"""Retention over a long idle run whose checkpoints reference an old base: nothing kept forever.

An idle keyed instance's handle names its base's chain (``unchanged_since``)
and writes no file. A daemon idle for hours then completes hundreds of
checkpoints that all reference one base, long out of retention itself; an
instance with a change now and then writes a delta, a full copy once
``full_every`` is due. Retention must keep every file a retained checkpoint
(or a snapshot in flight) references and delete the rest: the shared files
stay within one chain per instance, never growing with the number of
checkpoints, and every retained checkpoint restores the state it was taken at,
also at another parallelism, aborted checkpoints between them included, and
after the process that pinned its base is gone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.checkpoint.storage import CheckpointStorage
from aiostream_ckpt.state.descriptors import ValueStateDescriptor
from aiostream_ckpt.state.lmdb import LmdbStateBackend
from tests.unit.state.conftest import Env

FULL_EVERY, CHECKPOINTS = 3, 240


def _metadata(storage: CheckpointStorage, cid: int, handles: list[Any]) -> CompletedCheckpoint:
    subtasks = {str(i): {"subtask": i, "parallelism": len(handles), "keyed": h}
                for i, h in enumerate(handles)}  # fmt: skip
    return CompletedCheckpoint(
        checkpoint_id=cid,
        is_savepoint=False,
        job_name="j",
        trigger_time=0.0,
        completion_time=0.0,
        duration_seconds=0.0,
        max_parallelism=128,
        operators={"op": {"parallelism": len(handles), "subtasks": subtasks}},
        tasks={},
        size_bytes=0,
        directory=storage.checkpoint_dir(cid),
        root=storage.root,
    )


def _restored(env: Env, root: Path, handles: list[Any], parallelism: int) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for i in range(parallelism):
        r = env.backend(index=i, parallelism=parallelism)
        r.restore(root, handles)
        out.update(env.dump(r, {"v": r.create_state(ValueStateDescriptor("v"))})["v"])
        r.close()
    return out


def test_a_long_idle_run_keeps_what_it_references_and_no_more(env: Env, tmp_path: Path) -> None:
    storage = CheckpointStorage(tmp_path / "ckpt")
    backends: list[LmdbStateBackend] = []
    states = []
    for i in range(2):
        b = env.backend(index=i, parallelism=2, full_checkpoint_every=FULL_EVERY)
        backends.append(b)
        states.append(b.create_state(ValueStateDescriptor("v")))
    owner = {k: env.owner(k, 2) for k in range(8)}
    model: dict[int, int] = {}
    taken: dict[int, tuple[dict[int, int], list[Any]]] = {}
    most = 0
    for cid in range(1, CHECKPOINTS + 1):
        if cid < 20 or cid % 37 == 0:  # busy at first, then a rare change on one instance
            k = cid % 8
            backends[owner[k]].key_context.key = k
            states[owner[k]].update(cid)
            model[k] = cid
        handles = [
            env.finish(b.snapshot(storage.target(cid, "op", i))) for i, b in enumerate(backends)
        ]
        if cid % 11 == 0:  # declined elsewhere: its changes go into the next snapshot
            for b in backends:
                b.notify_checkpoint_aborted(cid)
            storage.discard_incomplete(only=cid)
            continue
        storage.write_completed(_metadata(storage, cid, handles))
        for b in backends:
            b.notify_checkpoint_complete(cid)
        storage.apply_retention(1)
        taken[cid] = (dict(model), handles)
        shared = {p.relative_to(storage.root).as_posix() for p in storage.shared_dir.iterdir()}
        referenced = {f for h in handles for f in h["files"]}
        assert referenced <= shared, (cid, sorted(referenced - shared))
        kept = referenced | storage.local_pins()  # a full copy keeps its base pinned till the next
        assert shared <= kept, (cid, sorted(shared - kept))
        most = max(most, len(shared))
        if (cid - 1) % 11 == 0 or cid % 50 == 0:  # after an abort; a base long out of retention
            assert _restored(env, storage.root, handles, 1) == model, cid
    # a chain per instance (a full copy's tail too), and the one just replaced
    assert most <= 2 * 2 * (FULL_EVERY + 1), most
    idle = [cid for cid, (_, hs) in taken.items() if all(h.get("unchanged_since") for h in hs)]
    assert len(idle) > CHECKPOINTS // 2
    latest = max(taken)
    want, handles = taken[latest]
    assert all(h.get("unchanged_since") for h in handles)
    for b in backends:  # the process ends: no pin is left, only the metadata protects files
        b.close()
    CheckpointStorage(storage.root).apply_retention(1)
    for parallelism in (1, 2, 3):
        assert _restored(env, storage.root, handles, parallelism) == want
