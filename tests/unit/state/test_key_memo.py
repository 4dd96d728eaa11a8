"""The key memo of ``KeyedStateBase.encode``: a remembered LMDB key is the one it would build.

Each test runs the same writes through a backend with the memo and one
without (``_KEY_MEMO_MAX = 0``) and compares what they store: the working
LMDB, the delta files and what a restore reads back. Keys that are equal in
a dict but stored as other bytes (``1``, ``True``, ``1.0``; tuples holding
them) are written in turn, so a memo that trusted dict equality would store
one under the other's LMDB key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from aiostream_ckpt.state.descriptors import ValueStateDescriptor
from aiostream_ckpt.state.lmdb import LmdbStateBackend, states
from aiostream_ckpt.state.lmdb.snapshot import read_delta

Sessions = list[tuple[int, int, int]]
KEYS: list[Any] = ["a", "b", "user-7", 1, 2, 300, -5, ("t", 1)]
#: epochs of writes, in order: (key, value); None clears. A key's sessions come from its value.
EPOCHS: list[list[tuple[Any, Any]]] = [
    [(k, i) for i, k in enumerate(KEYS)],
    [("a", 10), ("b", None), (True, 11), (2.0, 12), (("t", True), 13)],
    [("b", 20), (True, None), (1, 21), ("user-7", None), (1.0, 22), (300, 23)],
    [("a", None), (2, 30), (("t", 1), None), (False, 31), (0, 32)],
]


@contextmanager
def _no_memo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with monkeypatch.context() as m:
        m.setattr(states, "_KEY_MEMO_MAX", 0)
        yield


class _Run:
    """One backend with a value state and a session-like state, written epoch by epoch."""

    def __init__(self, env: Any, uid: str) -> None:
        self.env = env
        self.b: LmdbStateBackend = env.backend(uid=uid, full_checkpoint_every=10)
        self.v = self.b.create_state(ValueStateDescriptor("v"))
        self.s = self.b.create_state(ValueStateDescriptor("s", Sessions))
        self.handles: list[Any] = []

    def epoch(self, cid: int, writes: list[tuple[Any, Any]], around: Callable[[], Any]) -> None:
        ctx = self.b.key_context
        for key, value in writes:
            ctx.key = key
            if value is None:
                self.v.clear()
            else:
                self.v.update(value)
        sessions = {k: None if v is None else [(v, v + 30, 1)] for k, v in writes}
        self.s.update_all_unchanged(sessions)  # the session operator's path (dumps at encode)
        with around():
            self.handles.append(self.env.checkpoint(self.b, cid))

    def stored(self) -> dict[bytes, bytes]:
        return dict(self.b.read_txn().cursor())

    def delta(self) -> list[list[Any]]:
        entry = self.handles[-1]["chain"][-1]
        return [sorted(r) for r in read_delta(self.env.root / entry["path"], entry["path"])]


def test_memo_stores_what_the_cold_path_stores(env, monkeypatch):
    warm, cold = _Run(env, "warm"), _Run(env, "cold")
    for cid, writes in enumerate(EPOCHS, 1):
        warm.epoch(cid, writes, monkeypatch.context)
        cold.epoch(cid, writes, lambda: _no_memo(monkeypatch))
        assert warm.stored() == cold.stored()
        assert warm.delta() == cold.delta()
    assert warm.s._key_memo and not cold.s._key_memo
    # every key the memo holds maps to the LMDB key the state builds for it
    for state in (warm.v, warm.s):
        for key, (db_key, _kg) in state._key_memo.items():
            assert db_key == state.db_key(key)
        assert all(key.__class__ in (str, int) for key in state._key_memo)
    # True, 2.0, ("t", True), False went in after 1, 2, ("t", 1), 0: stored under their own bytes
    raw = set(warm.stored())
    assert {warm.v.db_key(k) for k in (True, 2.0, ("t", True), False)} <= raw


def _plain(key: Any) -> bool:
    """A key no other key of the test equals (no bool or float in it)."""
    if key.__class__ is tuple:
        return all(_plain(k) for k in key)
    return key.__class__ in (str, int)


def test_memo_restores_and_rescales(env, monkeypatch):
    """Restore into two instances (a rescale), write on with the memo warm, scale in."""
    run = _Run(env, "op")
    for cid, writes in enumerate(EPOCHS, 1):
        run.epoch(cid, [(k, v) for k, v in writes if _plain(k)], monkeypatch.context)
    want = env.dump(run.b, {"v": run.v})["v"]
    halves = []
    for index in (0, 1):
        r = env.backend(index=index, parallelism=2, uid="op")
        r.restore(env.root, [run.handles[-1]])
        halves.append((r, r.create_state(ValueStateDescriptor("v"))))
    got: dict[Any, Any] = {}
    for r, v in halves:
        got.update(env.dump(r, {"v": v})["v"])
    assert got == want
    handles = []
    for cid in (10, 11):  # every key again in the instance that owns it: the second, memo warm
        for index, (r, v) in enumerate(halves):
            for key in KEYS:
                if env.owner(key, 2) == index:
                    r.key_context.key = key
                    v.update(cid)
            handles.append(env.checkpoint(r, cid))
    for index, (_, v) in enumerate(halves):
        assert len(v._key_memo) == sum(
            env.owner(k, 2) == index and k.__class__ is not tuple for k in KEYS
        )
    one = env.backend(uid="op")
    one.restore(env.root, handles[-2:])
    v = one.create_state(ValueStateDescriptor("v"))
    assert env.dump(one, {"v": v})["v"] == {**want, **dict.fromkeys(KEYS, 11)}


def test_memo_is_bounded(env, monkeypatch):
    monkeypatch.setattr(states, "_KEY_MEMO_MAX", 4)
    b = env.backend()
    v = b.create_state(ValueStateDescriptor("v"))
    ctx = b.key_context
    seen = []

    def write(cid: int, keys: range) -> None:
        for k in keys:
            ctx.key = k
            v.update(k + cid)
        env.checkpoint(b, cid)
        seen.append(len(v._key_memo))

    write(1, range(3))  # remembered
    write(2, range(3, 6))  # one more fits
    write(3, range(6, 9))  # full at the start: cleared, then these
    write(4, range(100, 110))  # more than it holds: not remembered at all
    assert seen == [3, 4, 3, 3]
    r = env.backend()
    r.restore(env.root, [env.checkpoint(b, 5)])
    rv = r.create_state(ValueStateDescriptor("v"))
    assert env.dump(r, {"v": rv})["v"] == {
        **{k: k + 1 for k in range(3)},
        **{k: k + 2 for k in range(3, 6)},
        **{k: k + 3 for k in range(6, 9)},
        **{k: k + 4 for k in range(100, 110)},
    }
