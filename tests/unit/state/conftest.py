"""Shared helpers for the LMDB state backend tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.state.backend import AsyncSnapshotPart, SnapshotTarget, StateHandle
from aiostream_ckpt.state.codecs import StateTypeError
from aiostream_ckpt.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from aiostream_ckpt.state.keygroups import KeyGroupRange, key_group_for, serialize_key
from aiostream_ckpt.state.lmdb import LmdbStateBackend

MAXP = 128


def _make_target(root: Path, checkpoint_id: int, *, savepoint: bool = False) -> SnapshotTarget:
    excl = root / f"savepoint-{checkpoint_id}" if savepoint else root / f"chk-{checkpoint_id}"
    return SnapshotTarget(
        checkpoint_id=checkpoint_id,
        root=root,
        exclusive_dir=excl,
        shared_dir=root / "shared",
        is_savepoint=savepoint,
    )


class Env:
    """Creates backends under one tmp dir and closes them at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "checkpoints"
        self.root.mkdir()
        self.clock = ManualClock(start=1000.0)
        self.backends: list[LmdbStateBackend] = []

    def backend(
        self, index: int = 0, parallelism: int = 1, uid: str = "op", **kw: Any
    ) -> LmdbStateBackend:
        kw.setdefault("clock", self.clock)
        # these tests choose the chain shape with full_checkpoint_every alone; the
        # size rule has its own tests (test_snapshot.py)
        kw.setdefault("max_delta_ratio", 0.0)
        b = LmdbStateBackend(
            operator_uid=uid,
            subtask_index=index,
            key_group_range=KeyGroupRange.for_operator(index, parallelism, MAXP),
            max_parallelism=MAXP,
            local_dir=self.tmp / "local",
            **kw,
        )
        self.backends.append(b)
        return b

    def checkpoint(
        self, b: LmdbStateBackend, cid: int, *, complete: bool = True, savepoint: bool = False
    ) -> StateHandle:
        handle = self.finish(b.snapshot(self.target(cid, savepoint=savepoint)))
        if complete:
            b.notify_checkpoint_complete(cid)
        return handle

    def refuse_everywhere(self, tp: Any, value: Any, match: str) -> None:
        """Assert ValueState.update, ListState.add and MapState.put of ``value`` (declared
        ``tp``) raise StateTypeError matching ``state '<name>'`` + ``match``."""
        b = self.backend()
        b.key_context.key = "k"
        for d, write in (
            (ValueStateDescriptor("v", tp), lambda s: s.update(value)),
            (ListStateDescriptor("l", tp), lambda s: s.add(value)),
            (MapStateDescriptor("m", str, tp), lambda s: s.put("x", value)),
        ):
            s = b.create_state(d)
            with pytest.raises(StateTypeError, match=rf"state '{d.name}'{match}"):
                write(s)

    def read_back(self, descriptor: Any, value: Any, key: Any = "k") -> Any:
        """Store ``value`` in a value state, checkpoint, restore a new backend: its value."""
        b = self.backend()
        b.key_context.key = key
        b.create_state(descriptor).update(value)
        r = self.backend()
        r.restore(self.root, [self.checkpoint(b, 1)])
        r.key_context.key = key
        return r.create_state(descriptor).value()

    @staticmethod
    def finish(part: AsyncSnapshotPart, *, settle: bool = True) -> StateHandle:
        """Run an async snapshot part as the task does: prepare, write, settle."""
        asyncio.run(part.prepare())
        handle = part.write()
        if settle:
            asyncio.run(part.settle())
        return handle

    def target(self, cid: int, *, savepoint: bool = False) -> SnapshotTarget:
        return _make_target(self.root, cid, savepoint=savepoint)

    @staticmethod
    def owner(key: Any, parallelism: int) -> int:
        """Index of the instance (of ``parallelism``) that owns ``key``."""
        return key_group_for(serialize_key(key), MAXP) * parallelism // MAXP

    def checkpoint_instances(
        self,
        parallelism: int,
        cid: int,
        act: Callable[[LmdbStateBackend, str, int], Any],
        restore: list[StateHandle] | None = None,
    ) -> list[StateHandle]:
        """Checkpoint ``cid`` of each instance after ``act(backend, its key, index)``.

        Each instance is restored from ``restore`` first, when given; its key is
        the first ``k<n>`` it owns (the key context is set to it).
        """
        handles = []
        for i in range(parallelism):
            b = self.backend(index=i, parallelism=parallelism)
            if restore is not None:
                b.restore(self.root, restore)
            b.key_context.key = key = next(
                k for k in (f"k{n}" for n in range(999)) if self.owner(k, parallelism) == i
            )
            act(b, key, i)
            handles.append(self.checkpoint(b, cid))
        return handles

    @staticmethod
    def dump(b: LmdbStateBackend, states: dict[str, Any]) -> dict[str, dict[Any, Any]]:
        return _dump(b, states)

    def close(self) -> None:
        for b in self.backends:
            b.close()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    e.close()


def _dump(b: LmdbStateBackend, states: dict[str, Any]) -> dict[str, dict[Any, Any]]:
    """Every (state, key) -> value visible through the public API."""
    readers: dict[str, Callable[[Any], Any]] = {
        "value": lambda s: s.value(),
        "list": lambda s: s.get(),
        "map": lambda s: dict(s.items()),
        "reducing": lambda s: s.get(),
    }
    out: dict[str, dict[Any, Any]] = {}
    for name, state in states.items():
        read = readers[state.kind]
        got = {}
        for key in sorted(b.keys(name), key=repr):
            b.key_context.key = key
            got[key] = read(state)
        out[name] = got
    return out
