"""The per-key fast paths of the async snapshot part: ints, the change log as delta, restore.

Ints are encoded with ``b"%d"`` (small ones from a table) instead of orjson
(same bytes, as long as orjson would accept the int); deltas are written from
the records applied, not read back from LMDB; restore merges a chain's deltas.
Each must give exactly what the generic path gave.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from aiostream_ckpt.state.descriptors import MapStateDescriptor, ValueStateDescriptor

MIXED: list[Any] = [
    0,
    1,
    -1,
    4095,  # the last of the pre-encoded small ints
    4096,
    True,
    False,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    -7,
    1.5,
    "12",
    "",
    [1, 2],
    {"a": 1},
    ["x", [3, None]],
]


def _same(got: Any, want: Any) -> bool:
    """Equal and of the same JSON type (True must not come back as 1, nor 1 as 1.0)."""
    want_json = orjson.loads(orjson.dumps(want))
    return bool(type(got) is type(want_json) and got == want_json)


def _restore_value_state(env: Any, handle: Any, keys: int) -> dict[int, Any]:
    r = env.backend()
    r.restore(env.root, [handle])
    v = r.create_state(ValueStateDescriptor("v", default="missing"))
    out = {}
    for k in range(keys):
        r.key_context.key = k
        out[k] = v.value()
    return out


def test_int_fast_path_round_trips_through_full_delta_and_restore(env):
    b = env.backend()
    v = b.create_state(ValueStateDescriptor("v", default="missing"))
    n = len(MIXED)
    for k, value in enumerate(MIXED):
        b.key_context.key = k
        v.update(value)
    full = env.checkpoint(b, 1)
    # the delta: the same mix shifted by one key, plus a clear, so every key changes type
    model = {}
    for k in range(n):
        b.key_context.key = k
        if k == 3:
            v.clear()
            model[k] = "missing"
        else:
            model[k] = MIXED[(k + 1) % n]
            v.update(model[k])
    delta = env.checkpoint(b, 2)
    assert delta["kind"] == "incremental" and delta["delta_records"] == n
    got_full = _restore_value_state(env, full, n)
    assert all(_same(got_full[k], MIXED[k]) for k in range(n)), got_full
    got = _restore_value_state(env, delta, n)
    assert all(_same(got[k], model[k]) for k in range(n)), (got, model)


@pytest.mark.parametrize("big", [2**64, -(2**63) - 1, 10**30])
def test_ints_beyond_64_bits_round_trip(env, big):
    """orjson refused them (at the checkpoint) and read them back as floats; JSON has no limit."""
    b = env.backend()
    v = b.create_state(ValueStateDescriptor("v"))
    b.key_context.key = "big"
    v.update(big)
    r = env.backend()
    r.restore(env.root, [env.checkpoint(b, 1)])
    r.key_context.key = "big"
    got = r.create_state(ValueStateDescriptor("v")).value()
    assert type(got) is int and got == big


def test_delta_merges_early_flushes_and_map_clears(env):
    """A state written more than once in an epoch: the delta holds each key's newest value."""
    b = env.backend(cache_max_entries=40)  # two states: 20 each, evicts (flushes) often
    v = b.create_state(ValueStateDescriptor("v"))
    m = b.create_state(MapStateDescriptor("m"))
    ctx = b.key_context
    model_v: dict[int, Any] = {}
    model_m: dict[int, dict[str, int]] = {}
    for k in range(50):
        ctx.key = k
        v.update(k)
        model_v[k] = k
        m.put("a", k)
        model_m[k] = {"a": k}
    env.checkpoint(b, 1)
    for rnd in range(3):  # each round evicts, so one epoch has several applies
        for k in range(0, 50, 2):
            ctx.key = k
            if k % 10 == 0 and rnd == 1:
                v.clear()
                model_v.pop(k, None)
                m.clear()
                model_m[k] = {}
            else:
                v.update(k * 100 + rnd)
                model_v[k] = k * 100 + rnd
            m.put("b", rnd)
            model_m[k]["b"] = rnd
    delta = env.checkpoint(b, 2)
    assert delta["kind"] == "incremental"
    r = env.backend()
    r.restore(env.root, [delta])
    rv = r.create_state(ValueStateDescriptor("v"))
    rm = r.create_state(MapStateDescriptor("m"))
    for k in range(50):
        r.key_context.key = k
        assert rv.value() == model_v.get(k)
        assert dict(rm.items()) == model_m[k]


def test_chain_restore_merges_deltas_newest_wins(env):
    b = env.backend(full_checkpoint_every=10)
    v = b.create_state(ValueStateDescriptor("v"))
    ctx = b.key_context
    model: dict[int, int] = {}
    for k in range(100):
        ctx.key = k
        v.update(k)
        model[k] = k
    base = env.checkpoint(b, 1)["chain"]  # a full file, and its tail delta
    for cid in range(2, 6):
        for k in range(cid, 100, cid):
            ctx.key = k
            if k % 7 == 0 and cid == 3:
                v.clear()
                model.pop(k, None)
            else:
                v.update(k + 1000 * cid)
                model[k] = k + 1000 * cid
        handle = env.checkpoint(b, cid)
    assert handle["chain"][: len(base)] == base
    assert [e["kind"] for e in handle["chain"][len(base) :]] == ["delta"] * 4
    r = env.backend()
    r.restore(env.root, [handle])
    rv = r.create_state(ValueStateDescriptor("v"))
    assert sorted(r.keys("v")) == sorted(model)
    for k in range(100):
        r.key_context.key = k
        assert rv.value() == model.get(k)
