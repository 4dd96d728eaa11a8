"""CPU cost of the restore's key scan: undeclared keys restored under a declared key_type.

``python -m bench.restore_key_scan [--keys N] [--repeats N]`` writes N
undeclared int keys into one LMDB backend, checkpoints it, and restores it
``--repeats`` times undeclared (no scan) and under ``key_type=int`` (the
one-time scan of 7bd7288), then times the scan alone on the restored data.
Figures are CPU (``time.process_time``) medians: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from aiostream_ckpt.state.backend import SnapshotTarget
from aiostream_ckpt.state.descriptors import ValueStateDescriptor
from aiostream_ckpt.state.key_evolution import check_stored_keys
from aiostream_ckpt.state.lmdb import restore as restore_mod
from bench.backends import one_instance_backend


def _checkpoint(tmp: Path, root: Path, keys: int) -> Any:
    b = one_instance_backend("op", tmp / "local")
    state = b.create_state(ValueStateDescriptor("n", int))
    for k in range(keys):
        b.key_context.key = k
        state.update(k)
    part = b.snapshot(SnapshotTarget(1, root, root / "chk-1", root / "shared"))
    asyncio.run(part.prepare())
    handle = part.write()
    asyncio.run(part.settle())
    b.close()
    return handle


def run(keys: int, repeats: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="restore-key-scan-"))
    root = tmp / "checkpoints"
    root.mkdir()
    handle = _checkpoint(tmp, root, keys)
    took: dict[str, list[float]] = {
        "restore undeclared (no scan)": [],
        "restore under key_type=int": [],
        "scan alone": [],
    }
    for _ in range(repeats):
        for label, key_type in (
            ("restore undeclared (no scan)", None),
            ("restore under key_type=int", int),
        ):
            r = one_instance_backend("op", tmp / "local", key_type=key_type)
            started = time.process_time()
            r.restore(root, [handle])
            took[label].append(time.process_time() - started)
            if key_type is not None:
                with r._env.begin() as txn:  # the scan alone, on what was restored
                    started = time.process_time()
                    check_stored_keys("op", int, restore_mod.stored_keys(txn, r.key_group_range))
                    took["scan alone"].append(time.process_time() - started)
            r.close()
    for label, times in took.items():
        ms = statistics.median(times) * 1000
        print(f"{keys:,} keys, {label}: {ms:.1f} ms CPU (median of {repeats})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    run(a.keys, a.repeats)


if __name__ == "__main__":
    main()
