"""Copy-on-write snapshots: the barrier only freezes write sets; the async part applies them.

Each test checks the two promises: a snapshot restores to exactly the state at
its barrier, and the live state (reads on the event loop) is always the newest.
"""

from __future__ import annotations

import asyncio
import copy
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from aiostream_ckpt.errors import CheckpointError, StateError
from aiostream_ckpt.state.codecs import StateTypeError
from aiostream_ckpt.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    TtlUpdateType,
    ValueStateDescriptor,
)

TTL = StateTtlConfig(1e6, TtlUpdateType.ON_READ_AND_WRITE)  # never expires, refreshes on read


def _descriptors(ttl: StateTtlConfig | None = None) -> list[Any]:
    return [
        ValueStateDescriptor("v", default=0, ttl=ttl),
        ValueStateDescriptor("d", ttl=ttl),  # mutable values
        ListStateDescriptor("l", ttl=ttl),
        MapStateDescriptor("m", ttl=ttl),
        ReducingStateDescriptor("r", reduce_fn=lambda a, c: a + c, ttl=ttl),
    ]


def _open(b, ttl=None):
    return {d.name: b.create_state(d) for d in _descriptors(ttl)}


def _churn(b, states, rng, n_ops, keys=150):
    """Random writes of every kind, including in-place mutation of values read back.

    Trims the caches every 8 writes, as the task does after every batch.
    """
    for i in range(n_ops):
        if i % 8 == 7:
            b.after_batch()
        b.key_context.key = rng.randrange(keys)
        op = rng.random()
        if op < 0.2:
            states["v"].update(rng.randrange(1000))
        elif op < 0.25:
            states["v"].clear()
        elif op < 0.35:
            cur = states["d"].value()
            if cur is None:
                cur = {"n": 0, "xs": []}
            cur["n"] += 1  # mutate what value() returned, then update() it
            cur["xs"].append(rng.randrange(9))
            states["d"].update(cur)
        elif op < 0.37:
            states["d"].clear()
        elif op < 0.5:
            states["l"].add(rng.randrange(10))
        elif op < 0.52:
            states["l"].clear()
        elif op < 0.67:
            states["m"].put(rng.choice(["a", "b", ("c", 1)]), [rng.randrange(99)])
        elif op < 0.75:
            states["m"].remove(rng.choice(["a", "b"]))
        elif op < 0.77:
            states["m"].clear()
        elif op < 0.97:
            states["r"].add(rng.randrange(5))
        else:
            states["r"].clear()


def _dump(env, b, states):
    """A deep copy: the dump holds the live (mutable) objects the states return."""
    return copy.deepcopy(env.dump(b, states))


def _restore(env, handle, ttl=None):
    r = env.backend()
    r.restore(env.root, [handle])
    return env.dump(r, _open(r, ttl))


@pytest.mark.parametrize("cache", [1_000_000, 40], ids=["cached", "evicting"])
@pytest.mark.parametrize("full_every", [1, 4])
@pytest.mark.parametrize("ttl", [None, TTL], ids=["plain", "ttl"])
def test_writes_after_the_barrier_never_reach_the_snapshot(env, cache, full_every, ttl):
    """Randomized: churn after snapshot() (with and without eviction) before the async part."""
    rng = random.Random(3)
    b = env.backend(cache_max_entries=cache, full_checkpoint_every=full_every)
    states = _open(b, ttl)
    kinds = []
    for cid in range(1, 7):
        _churn(b, states, rng, 500)
        at_barrier = _dump(env, b, states)
        write = b.snapshot(env.target(cid))
        _churn(b, states, rng, 300)  # processing goes on; evictions write to LMDB meanwhile
        after = _dump(env, b, states)
        handle = env.finish(write)
        b.notify_checkpoint_complete(cid)
        kinds.append(handle["kind"])
        assert _restore(env, handle, ttl) == at_barrier, f"checkpoint {cid}"
        assert env.dump(b, states) == after  # the live state is untouched by the async part
    assert ("incremental" in kinds) == (full_every > 1)


def test_in_place_mutation_after_the_barrier_does_not_leak(env):
    b = env.backend()
    v = b.create_state(ValueStateDescriptor("v"))
    m = b.create_state(MapStateDescriptor("m"))
    r = b.create_state(ReducingStateDescriptor("r", reduce_fn=lambda acc, x: acc.append(x) or acc))
    lst = b.create_state(ListStateDescriptor("l"))
    b.key_context.key = "k"
    doc = {"n": 1, "xs": [1]}
    v.update(doc)
    mv = [1]
    m.put("a", mv)
    r.add([1])
    lst.add(1)
    write = b.snapshot(env.target(1))
    doc["xs"].append(99)  # mutate the object handed to update(), without update()
    got = v.value()
    got["n"] = 2  # mutate what value() returned and update() it: the documented pattern
    v.update(got)
    mv.append(99)  # mutate the object handed to put(), without put()
    m.get("a").append(2)
    r.add(2)  # reduce_fn appends to the accumulator in place
    lst.add(2)  # appends to the state's own list: copy-on-write
    live = (v.value(), m.get("a"), r.get(), lst.get())
    assert live == ({"n": 2, "xs": [1, 99]}, [1, 99, 2], [1, 2], [1, 2])
    handle = env.finish(write)
    assert _restore_named(env, handle, b) == {
        "v": {"k": {"n": 1, "xs": [1]}},
        "m": {"k": {"a": [1]}},
        "r": {"k": [1]},
        "l": {"k": [1]},
    }


def test_value_is_captured_at_update_not_at_the_barrier(env):
    """The contract: a snapshot holds each value as of its last update() before the barrier."""
    b = env.backend()
    v = b.create_state(ValueStateDescriptor("v"))
    b.key_context.key = "k"
    doc = {"n": 1}
    v.update(doc)
    doc["n"] = 2  # no update(): may be lost
    handle = env.checkpoint(b, 1)
    assert _restore_named(env, handle, b) == {"v": {"k": {"n": 1}}}
    assert v.value() == {"n": 2}  # until the key is evicted, reads see the mutation


def test_ttl_list_refreshed_on_read_after_the_barrier_does_not_leak(env):
    b = env.backend()
    lst = b.create_state(ListStateDescriptor("l", ttl=TTL))
    b.key_context.key = "k"
    lst.add(1)
    write = b.snapshot(env.target(1))
    assert lst.get() == [1]  # refreshes the timestamp: a new write of the same list
    lst.add(2)
    handle = env.finish(write)
    r = env.backend()
    r.restore(env.root, [handle])
    rl = r.create_state(ListStateDescriptor("l", ttl=TTL))
    r.key_context.key = "k"
    assert rl.get() == [1]


def _restore_named(env, handle, like):
    r = env.backend()
    r.restore(env.root, [handle])
    states = {n: r.create_state(s.descriptor) for n, s in like._states.items()}
    return env.dump(r, states)


def test_reads_during_a_pending_async_part_see_the_newest_values(env):
    b = env.backend(cache_max_entries=50)
    v = b.create_state(ValueStateDescriptor("v", default=-1))
    ctx = b.key_context
    for i in range(200):
        ctx.key = i
        v.update(i)
    b.after_batch()
    write = b.snapshot(env.target(1))
    for i in range(0, 200, 2):
        ctx.key = i
        v.update(i + 1000)
        b.after_batch()
    for i in range(200):  # most keys are evicted by now: these reads go to LMDB
        ctx.key = i
        assert v.value() == (i + 1000 if i % 2 == 0 else i)
    handle = env.finish(write)
    for i in range(200):
        ctx.key = i
        assert v.value() == (i + 1000 if i % 2 == 0 else i)
    assert _restore_named(env, handle, b) == {"v": {i: i for i in range(200)}}


def test_eviction_while_a_snapshot_is_pending_applies_and_pins_it(env):
    b = env.backend(cache_max_entries=20, full_checkpoint_every=3)
    v = b.create_state(ValueStateDescriptor("v"))
    ctx = b.key_context
    for i in range(10):
        ctx.key = i
        v.update(i)
    env.checkpoint(b, 1)
    for i in range(10):
        ctx.key = i
        v.update(-i)
    write = b.snapshot(env.target(2))
    for i in range(100, 160):  # fills the cache: evictions apply snapshot 2's write set
        ctx.key = i
        v.update(i)
        b.after_batch()  # as the task does after every batch
    ctx.key = 3
    v.update(333)
    b.flush()
    handle = env.finish(write)
    assert handle["kind"] == "incremental"
    assert handle["delta_records"] == 10
    assert _restore_named(env, handle, b) == {"v": {i: -i for i in range(10)}}
    ctx.key = 3
    assert v.value() == 333


@pytest.mark.parametrize("order", ["in_order", "reversed"])
@pytest.mark.parametrize("full_every", [1, 10])
def test_two_snapshots_before_either_async_part_runs(env, order, full_every):
    b = env.backend(full_checkpoint_every=full_every)
    v = b.create_state(ValueStateDescriptor("v"))
    m = b.create_state(MapStateDescriptor("m"))
    ctx = b.key_context

    def write_all(tag):
        for i in range(20):
            ctx.key = i
            v.update(f"{tag}{i}")
            m.put(tag, i)

    write_all("a")
    env.checkpoint(b, 1)
    write_all("b")
    w2 = b.snapshot(env.target(2))
    expected2 = _dump(env, b, {"v": v, "m": m})
    write_all("c")
    ctx.key = 5
    m.clear()
    w3 = b.snapshot(env.target(3))
    expected3 = _dump(env, b, {"v": v, "m": m})
    write_all("d")
    if order == "in_order":
        h2, h3 = env.finish(w2), env.finish(w3)
    else:
        h3, h2 = env.finish(w3), env.finish(w2)
    assert {h2["kind"], h3["kind"]} == {"full" if full_every == 1 else "incremental"}
    assert _restore_named(env, h2, b) == expected2
    assert _restore_named(env, h3, b) == expected3
    b.notify_checkpoint_complete(2)
    b.notify_checkpoint_complete(3)
    h4 = env.checkpoint(b, 4)
    assert _restore_named(env, h4, b) == env.dump(b, {"v": v, "m": m})


def test_aborted_snapshot_that_never_ran_keeps_its_writes(env):
    b = env.backend()
    v = b.create_state(ValueStateDescriptor("v"))
    ctx = b.key_context
    for k in "abc":
        ctx.key = k
        v.update(k)
    env.checkpoint(b, 1)
    ctx.key = "a"
    v.update("a2")
    ctx.key = "b"
    v.clear()
    write2 = b.snapshot(env.target(2))
    b.notify_checkpoint_aborted(2)
    with pytest.raises(CheckpointError, match="cancelled"):
        env.finish(write2)
    ctx.key = "d"
    v.update("d")
    w3 = b.snapshot(env.target(3))
    ctx.key = "e"
    v.update("e")
    b.snapshot(env.target(4))  # a later snapshot, never run: must not get in the way
    handle = env.finish(w3)
    assert handle["kind"] == "incremental"
    assert handle["delta_records"] == 3  # a, b (delete), d
    assert _restore_named(env, handle, b) == {"v": {"a": "a2", "c": "c", "d": "d"}}


def test_failed_async_part_keeps_the_write_set_for_the_next_try(env):
    b = env.backend()
    v = b.create_state(ValueStateDescriptor("v"))
    # a value or key that cannot be stored is refused at update() (test_state_types,
    # test_key_types); the engine's update_all_unchanged checks neither, so a key
    # that cannot be stored is found when the write set is encoded
    b.key_context.key = frozenset({1, 2})
    with pytest.raises(StateError, match="is not serializable"):
        v.update(1)
    v.update_all_unchanged({frozenset({1, 2}): 1})
    with pytest.raises(Exception, match="is not serializable"):
        env.finish(b.snapshot(env.target(1)))
    with pytest.raises(Exception, match="is not serializable"):
        b.flush()  # still queued, still first


def test_close_while_async_parts_are_pending_or_running(env):
    b = env.backend()
    v = b.create_state(ValueStateDescriptor("v"))
    for i in range(20_000):
        b.key_context.key = i
        v.update(i)
    pending = b.snapshot(env.target(1))
    v.update(-1)
    running = b.snapshot(env.target(2))
    asyncio.run(running.prepare())  # applies both write sets, pins both views
    outcome: list[Any] = []
    started = threading.Event()

    def run() -> None:
        started.set()
        try:
            outcome.append(running.write())
        except CheckpointError as exc:
            outcome.append(exc)

    t = threading.Thread(target=run)
    t.start()
    started.wait()
    b.close()  # waits for a running async part, cancels the pending one
    t.join()
    assert len(outcome) == 1
    with pytest.raises(CheckpointError):
        pending.write()
    with pytest.raises(CheckpointError, match="cancelled"):
        asyncio.run(pending.prepare())


async def test_async_parts_while_processing_goes_on(env):
    """Stress, as the task runs them: prepares on the loop interleave with writes,
    reads and evictions; writes run in a thread; several snapshots overlap."""
    rng = random.Random(11)
    b = env.backend(cache_max_entries=60, full_checkpoint_every=3, apply_slice_keys=7)
    states = _open(b)
    expected: dict[int, Any] = {}
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(1) as pool:

        async def finish(part: Any) -> Any:
            await part.prepare()
            return await loop.run_in_executor(pool, part.write)

        tasks: dict[int, asyncio.Task[Any]] = {}
        handles: dict[int, Any] = {}
        for cid in range(1, 14):
            for _ in range(8):  # processing in batches, the prepares' slices in between
                _churn(b, states, rng, 50)
                await asyncio.sleep(0)
            expected[cid] = _dump(env, b, states)
            tasks[cid] = asyncio.create_task(finish(b.snapshot(env.target(cid))))
            if cid % 3 == 0:  # complete some, in order, once done
                for done_cid, task in tasks.items():
                    handles[done_cid] = await task
                    b.notify_checkpoint_complete(done_cid)
                tasks.clear()
        handles.update({cid: await task for cid, task in tasks.items()})
    assert {h["kind"] for h in handles.values()} == {"full", "incremental"}
    for cid, handle in handles.items():
        assert _restore(env, handle) == expected[cid], f"checkpoint {cid}"


def test_captured_encodings_cannot_be_confused_with_user_values(env):
    """A bytearray in a write set marks "encoded at write time"; user bytearrays stay correct."""
    b = env.backend()
    j = b.create_state(ValueStateDescriptor("j"))
    p = b.create_state(ValueStateDescriptor("p", serializer="pickle"))
    b.key_context.key = "k"
    p.update(bytearray(b"raw"))
    p_handle = env.checkpoint(b, 1)
    r = env.backend()
    r.restore(env.root, [p_handle])
    r.key_context.key = "k"
    assert r.create_state(ValueStateDescriptor("p", serializer="pickle")).value() == b"raw"
    with pytest.raises(StateTypeError, match=r"'j'.*type bytearray"):
        j.update(bytearray(b"not json"))  # refused where it is stored, not at the flush
    b.flush()


def test_update_unchanged_is_encoded_by_the_snapshot_and_reads_back_typed(env):
    """An engine value held by reference (never changed after the call) is in the checkpoint.

    Typed as the session windows' list of ``(start, end, count)``: restored as
    tuples; an untyped and a TTL state store it as ``update()`` would.
    """
    b = env.backend()
    typed = b.create_state(ValueStateDescriptor("s", list[tuple[int, int, Any]]))
    ttl = b.create_state(ValueStateDescriptor("t", ttl=TTL))
    b.key_context.key = "k"
    sessions = [(0, 1_500, 2), (9_000, 10_000, None)]
    typed.update_unchanged(sessions)
    ttl.update_unchanged([1, 2])
    assert typed.value() is sessions
    handle = env.checkpoint(b, 1)
    typed.update_unchanged([(1, 2, 3)])  # a later value does not reach checkpoint 1
    assert _restore_named(env, handle, b) == {"s": {"k": sessions}, "t": {"k": [1, 2]}}
    r = env.backend()
    r.restore(env.root, [handle])
    r.key_context.key = "k"
    back = r.create_state(typed.descriptor).value()
    assert back == sessions and all(type(s) is tuple for s in back)
