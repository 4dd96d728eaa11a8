"""Restore time of a keyed-state checkpoint chain, with and without the delta-ratio rule.

``python -m bench.restore_chain [--keys N] [--changed N] [--checkpoints N]
[--max-delta-ratio R] [--changed-after N]`` writes N keys into one LMDB
backend, takes a full checkpoint, then ``--checkpoints`` more, each after
changing ``--changed`` random keys, and times a restore of the last one.
Then the restored backend changes ``--changed-after`` random keys and takes
its first checkpoint: its bytes and time are what a restart costs the next
checkpoint (a delta on the restored chain, not a full copy). It drives the
backend the way the task does (prepare on a loop, write, settle), without
the job around it, so the figure is the state backend's alone.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

from aiostream_ckpt.state.backend import SnapshotTarget
from aiostream_ckpt.state.descriptors import ValueStateDescriptor
from aiostream_ckpt.state.lmdb import LmdbStateBackend
from bench.backends import one_instance_backend


def _backend(tmp: Path, ratio: float) -> LmdbStateBackend:
    return one_instance_backend(
        "pv", tmp / "local", cache_max_entries=4_000_000, max_delta_ratio=ratio
    )


async def _checkpoint(b: LmdbStateBackend, root: Path, cid: int) -> dict[str, object]:
    target = SnapshotTarget(cid, root, root / f"chk-{cid}", root / "shared")
    part = b.snapshot(target)
    await part.prepare()
    handle = await asyncio.to_thread(part.write)
    await part.settle()
    b.notify_checkpoint_complete(cid)
    return handle


async def run(keys: int, changed: int, checkpoints: int, ratio: float, after: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="restore-chain-"))
    root = tmp / "checkpoints"
    b = _backend(tmp, ratio)
    v = b.create_state(ValueStateDescriptor("pv", default=0))
    names = [f"app-{i}" for i in range(keys)]
    for k in names:
        b.key_context.key = k
        v.update(1)
    rng = random.Random(0)
    handle: dict[str, object] = {}
    for cid in range(1, checkpoints + 2):
        if cid > 1:
            for k in rng.sample(names, changed):
                b.key_context.key = k
                v.update(cid)
        started = time.perf_counter()
        handle = await _checkpoint(b, root, cid)
        took = time.perf_counter() - started
        print(f"checkpoint {cid}: {handle['kind']}, {took:.2f} s, {handle['size_bytes']:,} bytes")
    chain = handle["chain"]
    assert isinstance(chain, list)
    r = _backend(tmp, ratio)
    started = time.perf_counter()
    r.restore(root, [handle])
    took = time.perf_counter() - started
    print(f"restore of a {len(chain)}-file chain: {took:.2f} s (max_delta_ratio={ratio})")
    b.close()
    v = r.create_state(ValueStateDescriptor("pv", default=0))
    for k in rng.sample(names, after):
        r.key_context.key = k
        v.update(-1)
    cid = checkpoints + 2
    started, cpu = time.perf_counter(), time.process_time()
    first = await _checkpoint(r, root, cid)
    took, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(
        f"first checkpoint after restore ({after:,} keys changed): {first['kind']}, "
        f"{took:.2f} s ({cpu:.2f} s CPU), {first['size_bytes']:,} bytes written"
    )
    r.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--changed", type=int, default=300_000)
    p.add_argument("--checkpoints", type=int, default=9, help="after the first full one")
    p.add_argument("--max-delta-ratio", type=float, default=0.5)
    p.add_argument("--changed-after", type=int, default=10_000, help="after the restore")
    a = p.parse_args()
    asyncio.run(run(a.keys, a.changed, a.checkpoints, a.max_delta_ratio, a.changed_after))


if __name__ == "__main__":
    main()
