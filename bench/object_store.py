"""Checkpoints in an object store (SeaweedFS) against the local directory, and a restore from it.

``python -m bench.object_store [--events N] [--pairs N] [--restore-keys N]``:

1. **Throughput.** pv_count over ``--events`` generated events (parallelism 1,
   checkpoints every second), run as ``aiostream-ckpt run`` with
   ``checkpoint.dir`` local (A) and ``s3://`` on a local SeaweedFS (B),
   alternated A B A B ...; the figure is the median of the pairs' B/A
   throughput ratios (events / wall seconds of the run, start-up included in
   both).
2. **Restore on an empty disk.** A job counts 5 x ``--restore-keys`` events
   over that many keys (> 99 % of them drawn) into a checkpoint in the store;
   then, as a fresh host would, a new local copy claims the prefix, downloads
   the newest checkpoint (metadata and state files, each verified) and the
   LMDB backend restores from it: seconds of each step.

Run it under ``cpu-lock exclusive`` on a quiet machine; ``uptime`` is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from aiostream_ckpt.checkpoint.object_storage import ObjectCheckpointStorage
from aiostream_ckpt.objectstore import ObjectLocation, ObjectStore, S3Settings
from aiostream_ckpt_dev.s3server import SeaweedS3
from bench.backends import one_instance_backend

REPO = Path(__file__).resolve().parent.parent


def _run(sets: dict[str, str], env: dict[str, str]) -> float:
    cmd = [sys.executable, "-m", "aiostream_ckpt.daemon.cli", "run", "apps.pv_count"]
    cmd += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed


def throughput(server: SeaweedS3, tmp: Path, events: int, pairs: int) -> list[float]:
    env = {**os.environ, **server.env()}
    ratios = []
    for i in range(pairs):
        seconds = {}
        for mode in ("local", "s3"):
            base = {
                "app.generate": str(events),
                "app.keys": "10000",
                "app.output": str(tmp / f"out-{mode}-{i}"),
                "checkpoint.interval": "1s",
                "rest.enabled": "false",
            }
            if mode == "local":
                base["checkpoint.dir"] = str(tmp / f"ckpt-{i}")
            else:
                base["checkpoint.dir"] = f"s3://{server.buckets[0]}/bench-{uuid.uuid4().hex[:8]}"
                base["checkpoint.local_dir"] = str(tmp / f"local-{i}")
            seconds[mode] = _run(base, env)
        ratio = seconds["local"] / seconds["s3"]
        ratios.append(ratio)
        print(
            f"pair {i + 1}: local {events / seconds['local']:,.0f} ev/s, "
            f"s3 {events / seconds['s3']:,.0f} ev/s, ratio s3/local {ratio:.3f}",
            flush=True,
        )
    return ratios


def restore(server: SeaweedS3, tmp: Path, keys: int) -> None:
    os.environ.update(server.env())  # the fresh host's credentials, as a daemon's
    env = dict(os.environ)
    url = f"s3://{server.buckets[0]}/restore-{uuid.uuid4().hex[:8]}"
    _run(
        {
            # random keys out of ``keys``: 5 draws each leave < 1 % never drawn
            "app.generate": str(5 * keys),
            "app.keys": str(keys),
            "app.output": str(tmp / "out-restore"),
            "checkpoint.dir": url,
            "checkpoint.local_dir": str(tmp / "restore-source"),
            "checkpoint.interval": "0",
            "rest.enabled": "false",
        },
        env,
    )
    fresh = tmp / "fresh-host"
    location = ObjectLocation.parse(url)
    store = ObjectStore(S3Settings(), location.bucket)
    storage = ObjectCheckpointStorage(fresh, location, store, job_name="pv_count", retained=2)
    t0 = time.monotonic()
    storage.claim()
    t1 = time.monotonic()
    cid = next(storage.completed_newest_first())
    chk = storage.read_completed(cid, with_state=True)
    t2 = time.monotonic()
    handles = [st["keyed"] for st in chk.subtask_states("pv-count").values() if st.get("keyed")]
    size = sum(h["full_size_bytes"] for h in handles)
    backend = one_instance_backend("pv-count", fresh / "local", cache_max_entries=4_000_000)
    backend.restore(chk.root, handles)
    t3 = time.monotonic()
    restored = sum(1 for _ in backend.keys("pv"))
    storage.close()
    print(
        f"restore of {restored:,} keys ({size / 1e6:.1f} MB of state files) on an empty disk: "
        f"claim {t1 - t0:.2f} s, download {t2 - t1:.2f} s, LMDB restore {t3 - t2:.2f} s, "
        f"total {t3 - t0:.2f} s",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.object_store")
    p.add_argument("--events", type=int, default=4_000_000)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--restore-keys", type=int, default=1_000_000)
    args = p.parse_args()
    print("load:", os.getloadavg(), flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-object-store-"))
    with SeaweedS3(tmp / "s3") as server:
        if args.pairs:
            ratios = throughput(server, tmp, args.events, args.pairs)
            print(
                f"throughput s3/local at 1 s checkpoints: median of {len(ratios)} pairs "
                f"{statistics.median(ratios):.3f} (pairs: {', '.join(f'{r:.3f}' for r in ratios)})",
                flush=True,
            )
        if args.restore_keys:
            restore(server, tmp, args.restore_keys)
    print("load:", os.getloadavg(), flush=True)


if __name__ == "__main__":
    main()
