"""Measures (does not assert) the sync/async split of a snapshot with 1M dirty keys.

The synchronous part only freezes write sets, so it should not grow with the
number of dirty keys; the async part applies them to LMDB and copies the view.
"""

from __future__ import annotations

import time
import timeit

from aiostream_ckpt.state.descriptors import ValueStateDescriptor

N = 1_000_000
CHURN = 100  # every 100th key: 1%


def test_sync_part_does_not_grow_with_dirty_keys(env, capsys):
    b = env.backend(cache_max_entries=2 * N)
    v = b.create_state(ValueStateDescriptor("v"))
    ctx = b.key_context
    for i in range(N):
        ctx.key = i
        v.update(i)
    t0 = time.perf_counter()
    write = b.snapshot(env.target(1))  # freezes 1M dirty entries
    t1 = time.perf_counter()
    for i in range(0, N, CHURN):  # after the barrier: must not reach snapshot 1
        ctx.key = i
        v.update(-i)
    t2 = time.perf_counter()
    handle = env.finish(write)
    t3 = time.perf_counter()
    b.notify_checkpoint_complete(1)
    t4 = time.perf_counter()
    write2 = b.snapshot(env.target(2))  # 1% churn
    t5 = time.perf_counter()
    delta = env.finish(write2)
    t6 = time.perf_counter()
    ctx.key = 7
    hot = min(timeit.repeat(lambda: v.update(v.value() + 1), number=100_000, repeat=5)) / 1e5
    with capsys.disabled():
        print(
            f"\n[lmdb state, {N} keys] full: sync {1e3 * (t1 - t0):.2f} ms ({N} dirty),"
            f" async {1e3 * (t3 - t2):.0f} ms, {handle['size_bytes'] / 1e6:.1f} MB;"
            f" 1% churn: sync {1e3 * (t5 - t4):.2f} ms, async {1e3 * (t6 - t5):.0f} ms,"
            f" {delta['size_bytes'] / 1e6:.2f} MB; value()+update() {1e9 * hot:.0f} ns"
        )
    assert handle["kind"] == "full" and delta["kind"] == "incremental"
    assert delta["delta_records"] == N // CHURN
    for h, churned in ((handle, False), (delta, True)):
        r = env.backend()
        r.restore(env.root, [h])
        rv = r.create_state(ValueStateDescriptor("v"))
        for i in (1, 100, 200, N - 100, N - 1):
            r.key_context.key = i
            assert rv.value() == (-i if churned and i % CHURN == 0 else i)
        r.close()
