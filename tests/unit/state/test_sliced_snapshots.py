"""The asynchronous part on the event loop: encoding and applying in slices, shared by drivers.

A snapshot's ``prepare`` encodes (and packs its delta) in slices, yielding to
the loop; its ``settle`` applies to LMDB after the ack; a flush (eviction) may
run between any two slices and finishes whatever is half done; cancelling or
aborting a driver loses nothing. Every test checks a snapshot against the
state at its barrier, through a restore.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from aiostream_ckpt.errors import CheckpointError
from aiostream_ckpt.state.descriptors import MapStateDescriptor, ValueStateDescriptor
from aiostream_ckpt.state.lmdb import writes as writes_mod

SLICE = 7


def _fill(b: Any, v: Any, keys: range, offset: int = 0) -> dict[int, int]:
    for k in keys:
        b.key_context.key = k
        v.update(k + offset)
    return {k: k + offset for k in keys}


def _restore_values(env: Any, handle: Any) -> dict[Any, Any]:
    r = env.backend()
    r.restore(env.root, [handle])
    return env.dump(r, {"v": r.create_state(ValueStateDescriptor("v"))})["v"]


async def _checkpoint(env: Any, b: Any, cid: int) -> Any:
    part = b.snapshot(env.target(cid))
    await part.prepare()
    handle = part.write()
    await part.settle()
    b.notify_checkpoint_complete(cid)
    return handle


async def _turns_until(task: asyncio.Task[Any]) -> int:
    """Run the loop until ``task`` is done; return how often it yielded to us meanwhile."""
    turns = 0
    while not task.done():
        await asyncio.sleep(0)
        turns += 1
    await task
    return turns


async def test_prepare_and_settle_yield_to_the_loop_between_slices(env):
    b = env.backend(apply_slice_keys=SLICE)
    v = b.create_state(ValueStateDescriptor("v"))
    expected = _fill(b, v, range(200))
    part = b.snapshot(env.target(1))
    turns = await _turns_until(asyncio.create_task(part.prepare()))
    assert turns >= 200 // SLICE  # encoding 200 keys, then packing them
    handle = part.write()
    assert await _turns_until(asyncio.create_task(part.settle())) >= 200 // SLICE
    assert _restore_values(env, handle) == expected


async def test_lmdb_writes_and_encoding_happen_on_the_loop_thread(env, monkeypatch):
    threads: set[int] = set()
    for name in ("encode_slice", "apply_slice"):
        original = getattr(writes_mod.WriteQueue, name)

        def spy(self: Any, _original: Any = original) -> int:
            threads.add(threading.get_ident())
            return int(_original(self))

        monkeypatch.setattr(writes_mod.WriteQueue, name, spy)
    b = env.backend(apply_slice_keys=SLICE)
    v = b.create_state(ValueStateDescriptor("v"))
    expected = _fill(b, v, range(100))
    part = b.snapshot(env.target(1))
    await part.prepare()
    with ThreadPoolExecutor(1) as pool:
        handle = await asyncio.get_running_loop().run_in_executor(pool, part.write)
    await part.settle()
    assert threads == {threading.get_ident()}
    assert _restore_values(env, handle) == expected


@pytest.mark.parametrize("during", ["prepare", "settle"])
async def test_eviction_between_slices_finishes_the_half_done_work_first(env, during):
    b = env.backend(apply_slice_keys=SLICE, full_checkpoint_every=3)
    v = b.create_state(ValueStateDescriptor("v"))
    at_1 = _fill(b, v, range(100))
    part1 = b.snapshot(env.target(1))
    if during == "settle":
        await part1.prepare()
        handle1 = part1.write()
        task = asyncio.create_task(part1.settle())
    else:
        task = asyncio.create_task(part1.prepare())
    for _ in range(3):  # a few slices: a write set is half encoded, or half applied
        await asyncio.sleep(0)
    assert not task.done()
    live = {**at_1, **_fill(b, v, range(0, 100, 2), offset=1000)}
    b.flush()  # what an eviction does: everything queued, in order, then the new writes
    await task
    if during == "prepare":
        handle1 = part1.write()
        await part1.settle()
    b.notify_checkpoint_complete(1)
    assert _restore_values(env, handle1) == at_1
    part2 = b.snapshot(env.target(2))
    await part2.prepare()
    handle2 = part2.write()
    assert handle2["kind"] == "incremental"
    assert _restore_values(env, handle2) == live
    assert env.dump(b, {"v": v})["v"] == live


async def test_a_cancelled_prepare_leaves_its_work_to_the_next_driver(env):
    b = env.backend(apply_slice_keys=SLICE)
    v = b.create_state(ValueStateDescriptor("v"))
    at_1 = _fill(b, v, range(100))
    part1 = b.snapshot(env.target(1))
    task = asyncio.create_task(part1.prepare())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    task.cancel()  # the task running it went away half way
    with pytest.raises(asyncio.CancelledError):
        await task
    live = {**at_1, **_fill(b, v, range(50, 150), offset=7)}
    part2 = b.snapshot(env.target(2))
    await part2.prepare()  # encodes snapshot 1's write set first, then its own
    handle2 = part2.write()
    await part2.settle()
    assert _restore_values(env, handle2) == live
    await part1.prepare()  # nothing left to encode: only its delta to pack
    assert _restore_values(env, part1.write()) == at_1


async def test_an_abort_mid_prepare_cancels_it_and_the_next_delta_carries_its_writes(env):
    b = env.backend(apply_slice_keys=SLICE, full_checkpoint_every=5)
    v = b.create_state(ValueStateDescriptor("v"))
    live = _fill(b, v, range(30))
    await _checkpoint(env, b, 1)
    live.update(_fill(b, v, range(100), offset=500))
    part2 = b.snapshot(env.target(2))
    task = asyncio.create_task(part2.prepare())
    await asyncio.sleep(0)
    b.notify_checkpoint_aborted(2)
    with pytest.raises(CheckpointError, match="cancelled"):
        await task
    live.update(_fill(b, v, range(90, 110), offset=900))
    part3 = b.snapshot(env.target(3))
    await part3.prepare()
    handle3 = part3.write()
    assert handle3["kind"] == "incremental"
    assert handle3["delta_records"] == 110  # snapshot 2's writes and its own
    assert _restore_values(env, handle3) == live


@pytest.mark.parametrize("during", ["prepare", "settle"])
async def test_close_between_slices(env, during):
    b = env.backend(apply_slice_keys=SLICE)
    v = b.create_state(ValueStateDescriptor("v"))
    _fill(b, v, range(100))
    part = b.snapshot(env.target(1))
    if during == "settle":
        await part.prepare()
        part.write()
        task = asyncio.create_task(part.settle())
    else:
        task = asyncio.create_task(part.prepare())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    b.close()  # aborts a half-applied write transaction; the working copy goes
    if during == "settle":
        await task  # nothing left to settle
    else:
        with pytest.raises(CheckpointError, match="cancelled"):
            await task


async def test_full_snapshot_copies_the_applied_view_and_adds_the_rest_as_its_tail(env):
    b = env.backend(full_checkpoint_every=1)
    v = b.create_state(ValueStateDescriptor("v"))
    at_1 = _fill(b, v, range(50))
    part1 = b.snapshot(env.target(1))
    await part1.prepare()
    handle1 = part1.write()  # not settled: nothing is in LMDB yet
    at_2 = {**at_1, **_fill(b, v, range(40, 60), offset=100)}
    part2 = b.snapshot(env.target(2))
    await part2.prepare()
    handle2 = part2.write()
    # both write sets unapplied when snapshot 2 pinned its view: both are its tail
    assert [e.get("tail", False) for e in handle2["chain"]] == [False, True]
    assert handle2["delta_records"] == 60
    assert _restore_values(env, handle1) == at_1
    assert _restore_values(env, handle2) == at_2
    await part2.settle()
    at_3 = {**at_2, **_fill(b, v, range(5), offset=7)}
    part3 = b.snapshot(env.target(3))
    b.flush()  # applies snapshot 3's write set before it prepares: its view is pinned then
    await part3.prepare()
    handle3 = part3.write()
    assert [e["kind"] for e in handle3["chain"]] == ["full"]
    assert _restore_values(env, handle3) == at_3


async def test_map_clear_waits_for_earlier_write_sets_to_be_applied(env):
    """A clear is encoded as deletes of the stored entries: earlier writes must be in LMDB."""
    b = env.backend(apply_slice_keys=SLICE, full_checkpoint_every=4)
    m = b.create_state(MapStateDescriptor("m"))
    ctx = b.key_context
    for k in range(10):
        ctx.key = k
        for i in range(5):
            m.put(i, k * i)
    part1 = b.snapshot(env.target(1))
    await part1.prepare()
    part1.write()  # not settled: snapshot 1's entries are not in LMDB yet
    b.notify_checkpoint_complete(1)
    for k in range(0, 10, 3):
        ctx.key = k
        m.clear()
        m.put("new", k)
    expected = env.dump(b, {"m": m})
    part2 = b.snapshot(env.target(2))
    await part2.prepare()
    handle2 = part2.write()
    assert handle2["kind"] == "incremental"
    r = env.backend()
    r.restore(env.root, [handle2])
    assert env.dump(r, {"m": r.create_state(MapStateDescriptor("m"))}) == expected


async def test_encoding_error_in_a_late_slice_keeps_the_write_set_whole(env):
    b = env.backend(apply_slice_keys=SLICE)
    v = b.create_state(ValueStateDescriptor("v"))
    _fill(b, v, range(50))
    # not JSON: update() refuses it, the engine's update_all_unchanged does not check
    v.update_all_unchanged({frozenset({1, 2}): 1})  # the last slice fails
    part = b.snapshot(env.target(1))
    with pytest.raises(Exception, match="is not serializable"):
        await part.prepare()
    with pytest.raises(Exception, match="is not serializable"):
        b.flush()  # still queued, still first, from its first key
