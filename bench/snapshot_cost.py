"""The sync/async split of a keyed-state snapshot, full and incremental, with N dirty keys.

``python -m bench.snapshot_cost [--keys N] [--churn C]`` writes N keys into
one LMDB backend, snapshots them all (full: N dirty entries), changes every
C-th key after the barrier, and snapshots again (incremental). The
synchronous part only freezes the write set, so it should stay flat as N
grows; the async part encodes, writes and applies it. Also the cost of one
``value()`` + ``update()`` on a hot key. Driven the way the task drives the
backend (prepare, write, settle), without the job around it. The test
``tests/unit/state/test_snapshot_cost.py`` asserts the same run's outcome.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import timeit
from pathlib import Path

from aiostream_ckpt.state.backend import AsyncSnapshotPart, SnapshotTarget, StateHandle
from aiostream_ckpt.state.descriptors import ValueStateDescriptor
from bench.backends import one_instance_backend


def _finish(part: AsyncSnapshotPart) -> StateHandle:
    asyncio.run(part.prepare())
    handle = part.write()
    asyncio.run(part.settle())
    return handle


def run(keys: int, churn: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="snapshot-cost-"))
    root = tmp / "checkpoints"
    b = one_instance_backend("op", tmp / "local", cache_max_entries=2 * keys, max_delta_ratio=0.0)
    v = b.create_state(ValueStateDescriptor("v"))
    ctx = b.key_context
    for i in range(keys):
        ctx.key = i
        v.update(i)

    def target(cid: int) -> SnapshotTarget:
        return SnapshotTarget(cid, root, root / f"chk-{cid}", root / "shared")

    t0 = time.perf_counter()
    write = b.snapshot(target(1))
    t1 = time.perf_counter()
    for i in range(0, keys, churn):
        ctx.key = i
        v.update(-i)
    t2 = time.perf_counter()
    full = _finish(write)
    t3 = time.perf_counter()
    b.notify_checkpoint_complete(1)
    t4 = time.perf_counter()
    write2 = b.snapshot(target(2))
    t5 = time.perf_counter()
    delta = _finish(write2)
    t6 = time.perf_counter()
    ctx.key = 7
    hot = min(timeit.repeat(lambda: v.update(v.value() + 1), number=100_000, repeat=5)) / 1e5
    b.close()
    print(
        f"[lmdb state, {keys} keys] full: sync {1e3 * (t1 - t0):.2f} ms ({keys} dirty),"
        f" async {1e3 * (t3 - t2):.0f} ms, {full['size_bytes'] / 1e6:.1f} MB;"
        f" {100 / churn:g}% churn: sync {1e3 * (t5 - t4):.2f} ms, async {1e3 * (t6 - t5):.0f} ms,"
        f" {delta['size_bytes'] / 1e6:.2f} MB; value()+update() {1e9 * hot:.0f} ns"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--churn", type=int, default=100, help="change every C-th key (100: 1 %%)")
    a = p.parse_args()
    run(a.keys, a.churn)


if __name__ == "__main__":
    main()
