"""Per-key CPU of a snapshot's interpreter work: encode, pack the delta, put into LMDB.

``python -m bench.encode_cost [--keys N] [--kind sessions|counts] [--runs R]``
encodes one write set of N str keys R times (the key memo warm after the
first, as at every barrier of a key-by job), packs its records as a delta and
puts them in a write transaction (aborted), and prints the min and median CPU
ns per key of each step. ``sessions``: a session window's value (a list of
``(start, end, count)``, typed); ``counts``: pv_count's int. CPU time, so a
busy machine inflates it: compare two trees in alternating runs.
"""

from __future__ import annotations

import argparse
import gc
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from aiostream_ckpt.state.descriptors import ValueStateDescriptor
from aiostream_ckpt.state.lmdb.snapshot import ChangeLog, PackedDelta, pack_delta
from aiostream_ckpt.state.lmdb.writes import _put
from bench.backends import one_instance_backend


def write_set(kind: str, keys: int) -> tuple[ValueStateDescriptor, dict[str, Any]]:
    rnd = random.Random(1)
    if kind == "counts":
        return ValueStateDescriptor("count"), {
            f"user-{i}": rnd.randrange(10_000) for i in range(keys)
        }
    ts = 1_700_000_000_000
    values = {
        f"user-{i}": [
            (ts + j * 40_000, ts + j * 40_000 + 30_000, rnd.randrange(1, 50))
            for j in range(rnd.choice((1, 1, 2)))
        ]
        for i in range(keys)
    }
    return ValueStateDescriptor("window-sessions", list[tuple[int, int, int]]), values


def run(kind: str, keys: int, runs: int) -> dict[str, list[float]]:
    tmp = Path(tempfile.mkdtemp(prefix="encode-cost-"))
    b = one_instance_backend("op", tmp)
    descriptor, frozen = write_set(kind, keys)
    state = b.create_state(descriptor)
    gc.set_threshold(50_000)  # as tune_gc sets it in a task process
    out: dict[str, list[float]] = {"encode": [], "pack": [], "put": []}
    pt = time.process_time
    try:
        for _ in range(runs):
            log = ChangeLog()
            t0 = pt()
            for _ in state.encode(frozen, log, 4096, b.read_txn):
                pass
            t1 = pt()
            for _ in pack_delta([log], PackedDelta()):
                pass
            t2 = pt()
            txn = b._env.begin(write=True)
            for _ in _put(txn, log, 4096):
                pass
            txn.abort()
            t3 = pt()
            for step, dt in zip(out, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                out[step].append(dt / keys)
    finally:
        b.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--kind", choices=("sessions", "counts"), default="sessions")
    p.add_argument("--runs", type=int, default=30)
    a = p.parse_args()
    out = run(a.kind, a.keys, a.runs)
    print(
        f"[{a.kind}, {a.keys} keys, {a.runs} runs] CPU ns a key, min/median: "
        + " ".join(
            f"{k}={1e9 * min(v):.0f}/{1e9 * statistics.median(v):.0f}" for k, v in out.items()
        )
    )


if __name__ == "__main__":
    main()
