from __future__ import annotations

import pytest

from aiostream_ckpt.errors import StateError, StateMigrationError
from aiostream_ckpt.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    TtlUpdateType,
    ValueStateDescriptor,
)
from aiostream_ckpt.state.lmdb import LmdbStateBackend, LmdbStateBackendFactory


def test_rescale_two_to_three(env):
    keys = [f"user-{i}" for i in range(600)] + [("t", i) for i in range(100)]
    expected = {}
    handles = []
    for index in range(2):
        b = env.backend(index=index, parallelism=2, full_checkpoint_every=3)
        v = b.create_state(ValueStateDescriptor("v"))
        m = b.create_state(MapStateDescriptor("m"))
        mine = [k for k in keys if env.owner(k, 2) == index]
        for k in mine:
            b.key_context.key = k
            v.update(repr(k))
            m.put("first", 1)
            expected[k] = (repr(k), {"first": 1})
        env.checkpoint(b, 1)
        for k in mine[::3]:  # the restored chain has a delta with updates and deletes
            b.key_context.key = k
            v.update(repr(k) + "!")
            m.clear()
            expected[k] = (repr(k) + "!", {})
        handles.append(env.checkpoint(b, 2))
        assert handles[-1]["kind"] == "incremental"
    seen = {}
    for index in range(3):
        r = env.backend(index=index, parallelism=3)
        r.restore(env.root, handles)
        v = r.create_state(ValueStateDescriptor("v"))
        m = r.create_state(MapStateDescriptor("m"))
        got = set(r.keys("v"))
        assert all(env.owner(k, 3) == index for k in got)
        for k in got:
            assert k not in seen, f"{k!r} restored twice"
            r.key_context.key = k
            seen[k] = (v.value(), dict(m.items()))
    assert seen == expected


def test_rescale_three_to_one_and_mismatched_max_parallelism(env, tmp_path):
    handles = []
    for index in range(3):
        b = env.backend(index=index, parallelism=3)
        s = b.create_state(ReducingStateDescriptor("n", reduce_fn=lambda a, c: a + c))
        for k in range(300):
            if env.owner(k, 3) == index:
                b.key_context.key = k
                s.add(k)
        handles.append(env.checkpoint(b, 1))
    r = env.backend()
    r.restore(env.root, handles)
    s = r.create_state(ReducingStateDescriptor("n", reduce_fn=lambda a, c: a + c))
    assert sorted(r.keys("n")) == list(range(300))
    r.key_context.key = 299
    assert s.get() == 299
    other = LmdbStateBackend(
        operator_uid="op",
        subtask_index=0,
        key_group_range=env.backends[0].key_group_range,
        max_parallelism=64,
        local_dir=tmp_path / "x",
    )
    with pytest.raises(StateMigrationError, match="max_parallelism"):
        other.restore(env.root, handles)
    other.close()


@pytest.mark.parametrize("update_type", list(TtlUpdateType))
def test_ttl_expiry(env, update_type):
    ttl = StateTtlConfig(10.0, update_type)
    b = env.backend()
    v = b.create_state(ValueStateDescriptor("v", default="gone", ttl=ttl))
    lst = b.create_state(ListStateDescriptor("l", ttl=ttl))
    m = b.create_state(MapStateDescriptor("m", ttl=ttl))
    r = b.create_state(ReducingStateDescriptor("r", reduce_fn=max, ttl=ttl))
    b.key_context.key = "k"
    v.update(1)
    lst.add(1)
    m.put("a", 1)
    r.add(1)
    env.clock.advance(6)
    m.put("b", 2)
    assert (v.value(), lst.get(), m.get("a"), r.get()) == (1, [1], 1, 1)  # reads at t=6
    b.flush()
    env.clock.advance(6)  # t=12: written at 0, read at 6
    if update_type is TtlUpdateType.ON_READ_AND_WRITE:
        assert (v.value(), lst.get(), dict(m.items()), r.get()) == (1, [1], {"a": 1, "b": 2}, 1)
        env.clock.advance(10)
    else:
        assert (v.value(), lst.get(), dict(m.items()), r.get()) == ("gone", [], {"b": 2}, None)
        env.clock.advance(4)
    assert (v.value(), lst.get(), dict(m.items()), r.get()) == ("gone", [], {}, None)
    for name in ("v", "l", "m", "r"):
        assert list(b.keys(name)) == []


def test_ttl_survives_restore_and_expired_entries_are_not_snapshotted(env):
    ttl = StateTtlConfig(10.0)
    b = env.backend()
    v = b.create_state(ValueStateDescriptor("v", ttl=ttl))
    b.key_context.key = "old"
    v.update("o")
    env.clock.advance(8)
    b.key_context.key = "new"
    v.update("n")
    env.clock.advance(4)  # "old" expired, "new" has 6 s left
    handle = env.checkpoint(b, 1)
    r = env.backend()
    r.restore(env.root, [handle])
    v2 = r.create_state(ValueStateDescriptor("v", ttl=ttl))
    assert list(r.keys("v")) == ["new"]
    r.key_context.key = "new"
    assert v2.value() == "n"
    env.clock.advance(6)
    assert v2.value() is None
    no_ttl = env.backend()
    no_ttl.restore(env.root, [handle])
    with pytest.raises(StateMigrationError, match="ttl"):
        no_ttl.create_state(ValueStateDescriptor("v"))


class Point:
    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return isinstance(other, Point) and other.x == self.x

    def __reduce__(self):
        return (Point, (self.x,))


def test_pickle_state_round_trip_and_refusal(env):
    b = env.backend()
    p = b.create_state(ValueStateDescriptor("p", serializer="pickle"))
    b.key_context.key = "k"
    p.update(Point(3))
    handle = env.checkpoint(b, 1)
    assert handle["states"]["p"]["serializer"] == "pickle"
    ok = env.backend()
    ok.restore(env.root, [handle])
    ok.key_context.key = "k"
    assert ok.create_state(ValueStateDescriptor("p", serializer="pickle")).value() == Point(3)
    refused = env.backend()
    refused.restore(env.root, [handle])
    with pytest.raises(StateMigrationError, match="refusing to unpickle"):
        refused.create_state(ValueStateDescriptor("p"))
    assert issubclass(StateMigrationError, StateError)


def test_allow_pickle_converts_to_json_and_json_to_pickle_is_refused(env):
    b = env.backend()
    p = b.create_state(ValueStateDescriptor("p", serializer="pickle"))
    j = b.create_state(ValueStateDescriptor("j"))
    b.key_context.key = "k"
    p.update({"a": (1, 2)})
    j.update(1)
    handle = env.checkpoint(b, 1)
    untyped = env.backend(allow_pickle=True)
    untyped.restore(env.root, [handle])
    # untyped json would read the tuple back as a list: refused, not converted
    with pytest.raises(StateMigrationError, match=r"'p'.*tuple"):
        untyped.create_state(ValueStateDescriptor("p"))
    conv = env.backend(allow_pickle=True)
    conv.restore(env.root, [handle])
    conv.key_context.key = "k"
    typed = ValueStateDescriptor("p", dict[str, tuple[int, int]])
    assert conv.create_state(typed).value() == {"a": (1, 2)}
    with pytest.raises(StateMigrationError, match="serializer 'json'"):
        conv.create_state(ValueStateDescriptor("j", serializer="pickle"))
    with pytest.raises(StateMigrationError, match="kind"):
        conv.create_state(ListStateDescriptor("j"))


def test_cache_eviction_keeps_values_correct_across_checkpoints(env):
    b = env.backend(cache_max_entries=50, full_checkpoint_every=3)
    v = b.create_state(ValueStateDescriptor("v", default=0))
    lst = b.create_state(ListStateDescriptor("l"))
    model: dict = {}
    for rnd in range(5):
        for i in range(400):
            k = (i * 7919 + rnd) % 500
            b.key_context.key = k
            v.update(v.value() + 1)
            lst.add(rnd)
            model[k] = model.get(k, 0) + 1
        env.checkpoint(b, rnd + 1)
    handle = env.checkpoint(b, 99)
    r = env.backend()
    r.restore(env.root, [handle])
    for backend in (b, r):
        vv = backend.create_state(ValueStateDescriptor("v", default=0))
        assert sorted(backend.keys("v")) == sorted(model)
        for k, n in model.items():
            backend.key_context.key = k
            assert vv.value() == n


def test_factory_builds_configured_backends(env, tmp_path):
    factory = LmdbStateBackendFactory(cache_max_entries=10, full_checkpoint_every=1)
    b = factory(
        operator_uid="weird/uid with spaces",
        subtask_index=2,
        key_group_range=env.backend().key_group_range,
        max_parallelism=128,
        local_dir=tmp_path / "f",
    )
    v = b.create_state(ValueStateDescriptor("v"))
    b.key_context.key = 1
    v.update(1)
    h1 = env.finish(b.snapshot(env.target(1)))
    b.notify_checkpoint_complete(1)
    h2 = env.finish(b.snapshot(env.target(2)))
    assert (h1["kind"], h2["kind"]) == ("full", "full")
    assert "/" not in h1["files"][0].removeprefix("shared/")
    b.close()
