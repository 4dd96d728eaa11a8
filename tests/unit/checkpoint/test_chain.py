"""The chain's conditional writes: lost answers, late writes, a newer owner (a fake store).

The real server's semantics (atomic If-None-Match, If-Match) are pinned in
tests/integration/objectstore/test_server.py; here the store loses answers
on purpose, which a real one does only when the network fails.
"""

from __future__ import annotations

import hashlib

import pytest

from aiostream_ckpt.checkpoint.chain import CheckpointChain
from aiostream_ckpt.errors import (
    CheckpointOutcomeUnknownError,
    FencedError,
    ObjectNotFoundError,
    ObjectStoreError,
    PreconditionFailedError,
)
from aiostream_ckpt.objectstore import ObjectLocation


class FlakyStore:
    """One bucket in memory; ``lose_next`` applies a write but raises as if its answer was lost."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.lose_next = False
        self.down = False
        #: ``hold_next``: the next write neither lands nor answers; ``land_held`` lands it late
        self.hold_next = False
        self.held: tuple[str, bytes, str | None] | None = None

    def _etag(self, key: str) -> str:
        return hashlib.md5(self.objects[key]).hexdigest()

    def put_bytes(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        if self.down:
            raise ObjectStoreError("cannot reach the store", retriable=True)
        if self.hold_next:
            self.hold_next = False
            self.held = (key, data, if_match)
            raise ObjectStoreError("read timeout", retriable=True)
        if if_none_match and key in self.objects:
            raise PreconditionFailedError("exists")
        if if_match is not None and (key not in self.objects or self._etag(key) != if_match):
            raise PreconditionFailedError("changed")
        self.objects[key] = data
        if self.lose_next:
            self.lose_next = False
            raise ObjectStoreError("connection reset", retriable=True)
        return self._etag(key)

    def land_held(self) -> None:
        assert self.held is not None
        key, data, if_match = self.held
        self.held = None
        self.put_bytes(key, data, if_match=if_match)

    def get_bytes(self, key: str) -> tuple[bytes, str]:
        if self.down:
            raise ObjectStoreError("cannot reach the store", retriable=True)
        if key not in self.objects:
            raise ObjectNotFoundError(key)
        return self.objects[key], self._etag(key)


LOC = ObjectLocation("bkt", "job")


def _chain(store: FlakyStore) -> CheckpointChain:
    chain = CheckpointChain(store, LOC, "job")  # type: ignore[arg-type]
    chain.claim()
    return chain


def test_a_write_whose_answer_was_lost_but_landed_counts() -> None:
    store = FlakyStore()
    chain = _chain(store)
    store.lose_next = True
    chain.update({"high_water": 7})
    assert chain.state["high_water"] == 7
    chain.update({"high_water": 8})  # the ETag it holds is the landed write's
    assert chain.read()[0]["high_water"] == 8  # type: ignore[index]


def test_an_unreachable_store_leaves_the_outcome_unknown() -> None:
    store = FlakyStore()
    chain = _chain(store)
    store.down = True
    with pytest.raises(CheckpointOutcomeUnknownError):
        chain.update({"high_water": 7})
    store.down = False
    chain.touch()  # nothing landed: the attempt after the failover goes on


def test_a_late_write_of_ours_is_adopted_after_a_failover() -> None:
    store = FlakyStore()
    chain = _chain(store)
    store.hold_next = True
    entry = {"id": 5, "metadata": "chk-0000000005/_metadata.g1"}
    with pytest.raises(CheckpointOutcomeUnknownError):  # no answer, not there (yet)
        chain.update({"checkpoints": [entry]})
    store.land_held()  # ... and then it lands
    with pytest.raises(CheckpointOutcomeUnknownError, match="not changed as asked"):
        chain.touch()  # the next attempt's ownership check sees it: another failover
    chain.touch()
    assert chain.state["checkpoints"] == [entry]  # what that attempt restores


def test_a_newer_owner_fences() -> None:
    store = FlakyStore()
    old = _chain(store)
    _chain(store)
    with pytest.raises(FencedError, match="generation 2 > ours 1"):
        old.update({"high_water": 3})
    with pytest.raises(FencedError):
        old.touch()
