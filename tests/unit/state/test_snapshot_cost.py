"""Measures (does not assert) that the synchronous part is short next to the async part."""

from __future__ import annotations

import time
import timeit

from aiostream_ckpt.state.descriptors import ValueStateDescriptor

N = 200_000


def test_sync_part_is_short_relative_to_async_part(env, capsys):
    b = env.backend()
    v = b.create_state(ValueStateDescriptor("v"))
    ctx = b.key_context
    for i in range(N):
        ctx.key = i
        v.update(i)
    t0 = time.perf_counter()
    write = b.snapshot(env.target(1))  # flushes 200k dirty entries, pins a read txn
    t1 = time.perf_counter()
    handle = write()
    t2 = time.perf_counter()
    b.notify_checkpoint_complete(1)
    for i in range(0, N, 10):
        ctx.key = i
        v.update(-i)
    t3 = time.perf_counter()
    write2 = b.snapshot(env.target(2))
    t4 = time.perf_counter()
    delta = write2()
    t5 = time.perf_counter()
    ctx.key = 7
    v.update(7)
    ctx.key = 0
    v_value = v.value()
    hot = min(timeit.repeat(lambda: v.update(v.value() + 1), number=100_000, repeat=3)) / 1e5
    with capsys.disabled():
        print(
            f"\n[lmdb state, {N} keys] full: sync {1e3 * (t1 - t0):.1f} ms (flush of {N} dirty),"
            f" async {1e3 * (t2 - t1):.1f} ms, {handle['size_bytes'] / 1e6:.1f} MB;"
            f" 10% churn: sync {1e3 * (t4 - t3):.1f} ms, async {1e3 * (t5 - t4):.1f} ms,"
            f" {delta['size_bytes'] / 1e6:.2f} MB; value()+update() {1e9 * hot:.0f} ns"
        )
    assert handle["kind"] == "full" and delta["kind"] == "incremental"
    assert delta["delta_records"] == N // 10
    assert v_value == 0
    r = env.backend()
    r.restore(env.root, [delta])
    rv = r.create_state(ValueStateDescriptor("v"))
    for i in (1, 10, 199_990, 199_999):
        r.key_context.key = i
        assert rv.value() == (-i if i % 10 == 0 else i)
