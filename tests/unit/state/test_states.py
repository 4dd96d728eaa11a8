from __future__ import annotations

import pytest

from aiostream_ckpt.errors import StateError
from aiostream_ckpt.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)


def test_value_state_default_update_clear(env) -> None:
    b = env.backend()
    s = b.create_state(ValueStateDescriptor("count", default=0))
    assert b.create_state(ValueStateDescriptor("count", default=0)) is s
    b.key_context.key = "a"
    assert s.value() == 0
    s.update(s.value() + 1)
    s.update(s.value() + 1)
    assert s.value() == 2
    b.key_context.key = "b"
    assert s.value() == 0
    s.update({"x": [1, 2]})
    b.flush()
    assert s.value() == {"x": [1, 2]}
    s.clear()
    assert s.value() == 0
    b.key_context.key = "a"
    s.update(None)  # None clears, as in Flink
    assert s.value() == 0
    assert list(b.keys("count")) == []


def test_values_survive_flush_and_are_read_back_from_lmdb(env) -> None:
    b = env.backend(cache_max_entries=4)
    s = b.create_state(ValueStateDescriptor("v"))
    for i in range(50):
        b.key_context.key = ("k", i)
        s.update(i * 10)
    # update() leaves the bound to the task, which trims after every batch
    assert s.cache_size() == 50
    b.after_batch()
    assert s.cache_size() <= 4
    for i in range(50):
        b.key_context.key = ("k", i)
        assert s.value() == i * 10
        assert s.cache_size() <= 5  # a read miss checks the bound itself
    assert sorted(b.keys("v")) == [("k", i) for i in range(50)]


def test_value_reads_switch_path_with_the_miss_rate(env) -> None:
    """Many misses in a batch switch value() to .get(); a cached batch switches back."""
    from aiostream_ckpt.state.lmdb.states import _MISSES_COLD, ValueStateImpl

    b = env.backend()
    s = b.create_state(ValueStateDescriptor("n", default=0))
    hot = ValueStateImpl
    kc = b.key_context

    def batch(keys: range) -> None:  # one record per key, as the keyed operator runs it
        for k in keys:
            kc.key = k
            s.update(s.value() + 1)
        b.after_batch()

    batch(range(_MISSES_COLD - 1))  # few misses: stays on subscripts
    assert type(s) is hot
    batch(range(1000, 1000 + _MISSES_COLD))  # all new keys
    assert type(s) is not hot and isinstance(s, hot)
    batch(range(2000, 2000 + 2 * _MISSES_COLD))  # still missing: stays
    assert type(s) is not hot
    b.flush()  # the counts are in LMDB now, and reads of other keys still miss
    batch(range(3000, 3000 + _MISSES_COLD))
    batch(range(1000, 1000 + _MISSES_COLD))  # cached keys: back to subscripts
    assert type(s) is hot
    for keys, want in (
        (range(_MISSES_COLD - 1), 1),
        (range(1000, 1000 + _MISSES_COLD), 2),
        (range(2000, 2000 + 2 * _MISSES_COLD), 1),
    ):
        for k in keys:
            kc.key = k
            assert s.value() == want, k
    kc.key = "never"
    assert s.value() == 0


def test_list_state(env) -> None:
    b = env.backend()
    s = b.create_state(ListStateDescriptor("l"))
    b.key_context.key = 1
    assert s.get() == []
    s.add("a")
    s.add_all(["b", "c"])
    got = s.get()
    got.append("not stored")  # get() returns a copy
    assert s.get() == ["a", "b", "c"]
    b.flush()
    s.add("d")
    assert s.get() == ["a", "b", "c", "d"]
    s.update(["z"])
    assert s.get() == ["z"]
    s.update([])
    assert s.get() == []
    assert list(b.keys("l")) == []
    s.add_all([])
    assert s.get() == []


def test_map_state(env) -> None:
    b = env.backend()
    s = b.create_state(MapStateDescriptor("m"))
    b.key_context.key = "u1"
    assert s.is_empty()
    assert s.get("x") is None
    assert s.get("x", 7) == 7
    assert not s.contains("x")
    s.put("x", 1)
    s.put(("t", 2), None)  # None is a legal map value
    assert s.contains(("t", 2))
    assert s.get(("t", 2), "dflt") is None
    b.flush()
    b.key_context.key = "u2"
    s.put("y", 2)
    b.key_context.key = "u1"
    assert dict(s.items()) == {"x": 1, ("t", 2): None}
    s.remove("x")
    assert sorted(s.keys(), key=repr) == [("t", 2)]
    assert list(s.values()) == [None]
    s.clear()
    assert s.is_empty()
    s.put("after-clear", 3)
    b.flush()
    assert dict(s.items()) == {"after-clear": 3}
    assert sorted(b.keys("m")) == ["u1", "u2"]


def test_map_state_reads_entries_from_lmdb_after_eviction(env) -> None:
    b = env.backend(cache_max_entries=2)
    s = b.create_state(MapStateDescriptor("m"))
    for u in range(10):
        b.key_context.key = u
        for i in range(3):
            s.put(i, u * i)
    for u in range(10):
        b.key_context.key = u
        assert s.get(2) == 2 * u
        assert dict(s.items()) == {0: 0, 1: u, 2: 2 * u}
    b.key_context.key = 3
    s.clear()
    for u in range(10):  # force the clear through a flush + eviction
        b.key_context.key = u + 100
        s.put("z", 0)
    b.key_context.key = 3
    assert s.is_empty()
    assert 3 not in set(b.keys("m"))


def test_map_put_unread_reads_no_stored_entry_and_reads_them_when_asked(env) -> None:
    # a key out of the cache: put() loads its map (each entry decoded), put_unread() none
    b = env.backend(cache_max_entries=2)
    s = b.create_state(MapStateDescriptor("m"))
    decoded: list[bytes] = []
    loads = s._loads
    s._loads = lambda raw: decoded.append(raw) or loads(raw)

    def evict_k() -> None:
        for other in ("x", "y", "z"):  # past the cache's 2 keys: "k" is evicted
            b.key_context.key = other
            s.put_unread(0, 0)
        b.key_context.key = "k"

    b.key_context.key = "k"
    for i in range(10):
        s.put(i, [i] * 3)
    evict_k()
    s.put(10, [10])
    assert len(decoded) == 10  # put() of an uncached key: its map loaded whole
    evict_k()
    decoded.clear()
    s.put_unread(11, [11])
    assert decoded == []
    assert s.get(3) == [3, 3, 3]  # a stored entry is read when asked for
    assert len(decoded) == 1
    assert dict(s.items()) == {i: [i] * 3 for i in range(10)} | {10: [10], 11: [11]}
    evict_k()
    assert s.get(11) == [11]


def test_reducing_state(env) -> None:
    b = env.backend()
    s = b.create_state(ReducingStateDescriptor("sum", reduce_fn=lambda a, c: a + c))
    b.key_context.key = "k"
    assert s.get() is None
    for i in range(1, 5):
        s.add(i)
    assert s.get() == 10
    b.flush()
    s.add(5)
    assert s.get() == 15
    s.clear()
    assert s.get() is None


def test_unserializable_value_is_refused_at_update_naming_state_and_type(env) -> None:
    b = env.backend()
    s = b.create_state(ValueStateDescriptor("bad"))
    b.key_context.key = "k1"
    with pytest.raises(StateError, match=r"'bad'.*type set"):
        s.update({1, 2})
    assert s.value() is None, "a refused value changes nothing"
    b.flush()


def test_key_outside_range_is_refused(env) -> None:
    b = env.backend(index=0, parallelism=2)
    s = b.create_state(ValueStateDescriptor("v"))
    foreign = next(k for k in range(100) if env.owner(k, 2) == 1)
    b.key_context.key = foreign
    with pytest.raises(StateError, match="outside this instance"):
        s.value()


def test_redeclaring_with_other_kind_is_an_error(env) -> None:
    b = env.backend()
    b.create_state(ValueStateDescriptor("s"))
    with pytest.raises(StateError, match="already created"):
        b.create_state(ListStateDescriptor("s"))


def test_closed_backend_refuses_use_and_removes_working_copy(env) -> None:
    b = env.backend()
    b.create_state(ValueStateDescriptor("s"))
    local = env.tmp / "local"
    assert any(local.iterdir())
    b.close()
    b.close()  # idempotent
    assert not any(local.iterdir())
    with pytest.raises(StateError, match="closed"):
        b.create_state(ValueStateDescriptor("t"))
