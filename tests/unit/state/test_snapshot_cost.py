"""A full snapshot of 1M dirty keys, then a 1 % delta: each restores exactly what it froze.

Writes after the barrier must not reach the snapshot taken before them, and the
delta holds exactly the churned keys. The sync/async split of these snapshots
is measured by ``python -m bench.snapshot_cost``, not here.
"""

from __future__ import annotations

from aiostream_ckpt.state.descriptors import ValueStateDescriptor

N = 1_000_000
CHURN = 100  # every 100th key: 1%


def test_full_then_delta_of_a_million_keys_restore_exactly(env):
    b = env.backend(cache_max_entries=2 * N)
    v = b.create_state(ValueStateDescriptor("v"))
    ctx = b.key_context
    for i in range(N):
        ctx.key = i
        v.update(i)
    write = b.snapshot(env.target(1))  # freezes 1M dirty entries
    for i in range(0, N, CHURN):  # after the barrier: must not reach snapshot 1
        ctx.key = i
        v.update(-i)
    handle = env.finish(write)
    b.notify_checkpoint_complete(1)
    delta = env.finish(b.snapshot(env.target(2)))  # 1% churn
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
