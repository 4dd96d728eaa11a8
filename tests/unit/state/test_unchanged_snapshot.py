"""An instance whose state did not change references its base: no file written, none fsynced.

A daemon runs for weeks, mostly idle in places: at 1 s checkpoints an empty
delta per instance was ~86 k files (and 2 fsyncs each) a day for nothing, plus
a full copy every ``full_every`` of them (the empty deltas counted toward it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aiostream_ckpt.state.descriptors import ValueStateDescriptor
from aiostream_ckpt.state.lmdb import LmdbStateBackend
from tests.unit.state.conftest import Env


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _value_backend(env: Env, **kw: object) -> tuple[LmdbStateBackend, object]:
    b = env.backend(**kw)
    return b, b.create_state(ValueStateDescriptor("v"))


def _restored_values(env: Env, handles: list[dict], parallelism: int = 1) -> dict[int, object]:
    out: dict[int, object] = {}
    for i in range(parallelism):
        r = env.backend(index=i, parallelism=parallelism)
        r.restore(env.root, handles)
        out.update(env.dump(r, {"v": r.create_state(ValueStateDescriptor("v"))})["v"])
    return out


def test_idle_checkpoints_write_no_files(env: Env) -> None:
    b, v = _value_backend(env, full_checkpoint_every=2)
    for k in range(20):
        b.key_context.key = k
        v.update(k)
    env.checkpoint(b, 1)
    b.key_context.key = 0
    v.update(100)
    base = env.checkpoint(b, 2)  # a delta: the chain is [full, delta], due for a full one
    written = _files(env.root)
    for cid in range(3, 33):  # thirty idle checkpoints, three times full_every
        handle = env.checkpoint(b, cid)
        assert handle["chain"] == base["chain"], cid
        assert (handle["size_bytes"], handle["delta_records"]) == (0, 0)
        assert handle["unchanged_since"] == cid - 1
    assert _files(env.root) == written, "an idle instance wrote files"
    b.key_context.key = 1
    v.update(101)  # a change after the idle spell: the full copy that was due
    after = env.checkpoint(b, 33)
    assert after["kind"] == "full" and "unchanged_since" not in after
    assert _restored_values(env, [handle]) == {0: 100, **{k: k for k in range(1, 20)}}
    assert _restored_values(env, [after])[1] == 101


@pytest.mark.parametrize("second", ["aborted", "completed late"])
def test_only_a_completed_checkpoint_is_reused(env: Env, second: str) -> None:
    """Idle since checkpoint 2, which did not complete (yet): 3 still writes 2's changes."""
    b, v = _value_backend(env)
    b.key_context.key = "a"
    v.update(1)
    env.checkpoint(b, 1)
    v.update(2)
    env.checkpoint(b, 2, complete=False)
    if second == "aborted":  # declined, expired, subsumed: its changes go into the next delta
        b.notify_checkpoint_aborted(2)
    h3 = env.checkpoint(b, 3)
    assert "unchanged_since" not in h3 and h3["delta_records"] == 1
    if second == "completed late":
        b.notify_checkpoint_complete(2)  # 3 is the base already
    h4 = env.checkpoint(b, 4)
    assert h4["unchanged_since"] == 3 and h4["chain"] == h3["chain"]
    assert _restored_values(env, [h4]) == {"a": 2}


def test_idle_instances_restore_at_another_parallelism(env: Env) -> None:
    """Rescale from checkpoints whose handles are references: key groups split and merged."""
    backends = []
    for i in range(2):
        b = env.backend(index=i, parallelism=2)
        v = b.create_state(ValueStateDescriptor("v"))
        for k in range(40):
            if env.owner(k, 2) == i:
                b.key_context.key = k
                v.update(k * 10)
        backends.append(b)
    for cid in (1, 2, 3):
        handles = [env.checkpoint(b, cid) for b in backends]
    assert all(h["unchanged_since"] == 2 for h in handles)
    want = {k: k * 10 for k in range(40)}
    assert _restored_values(env, handles, parallelism=1) == want
    assert _restored_values(env, handles, parallelism=3) == want


def test_savepoint_of_an_idle_instance_is_self_contained(env: Env) -> None:
    b, v = _value_backend(env)
    b.key_context.key = "a"
    v.update(1)
    env.checkpoint(b, 1)
    env.checkpoint(b, 2)
    sp = env.checkpoint(b, 3, savepoint=True)
    assert sp["kind"] == "full" and "unchanged_since" not in sp
    assert all(f.startswith("savepoint-3/") for f in sp["files"])
    h4 = env.checkpoint(b, 4)  # a savepoint never becomes a base
    assert h4["unchanged_since"] == 2
    assert _restored_values(env, [sp]) == {"a": 1}
