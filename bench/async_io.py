"""Enrichment throughput: ``map_async`` next to the same lookup as a blocking ``map``.

``python -m bench.async_io [--latency 0.01] [--capacity 200] [--events N] [--repeats 3]``
runs ``apps/enrich.py`` (JSON-lines file source -> lookup -> exactly-once file
sink, 1 s exactly-once checkpoints, one subtask) four ways: ``map_async`` and a
blocking ``map``, each against the real HTTP lookup service
(``aiostream_ckpt_dev.lookup_service``, aiohttp, on a loopback port, in
this process) and against a simulated service (an ``asyncio.sleep`` /
``time.sleep`` of the same latency inside the job, no HTTP: the operator's
own ceiling). Throughput is committed output records over the steady window
(10 %..90 % of the records), from the sink's committed files polled every
100 ms; every run's committed output is checked to hold each input record
exactly once. The target per subtask is ``0.8 * capacity / latency``.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiostream_ckpt.connectors.generator import write_generated_jsonl
from aiostream_ckpt.connectors.staging import committed_files, read_committed_output
from aiostream_ckpt_dev.lookup_service import LookupService
from bench.stats import steady_window

REPO = Path(__file__).resolve().parent.parent


def _count_committed(out: Path, seen: dict[Path, int]) -> int:
    if not out.is_dir():
        return 0
    for path in committed_files(out):
        if path not in seen:  # committed files are renamed into place whole
            with open(path, "rb") as f:
                seen[path] = sum(1 for line in f if line.strip())
    return sum(seen.values())


def run_once(
    work: Path, *, mode: str, events: int, latency: float, capacity: int, service: str | None
) -> dict[str, Any]:
    inp = work / f"in-{events}.jsonl"
    if not inp.exists():
        write_generated_jsonl(inp, events, seed=7, keys=1000)
    run_dir = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=work))
    out = run_dir / "out"
    cmd = [
        sys.executable, "-m", "aiostream_ckpt.daemon.cli", "run", "apps.enrich",
        "--set", f"checkpoint.dir={run_dir / 'ckpt'}",
        "--set", f"app.input={inp}",
        "--set", f"app.output={out}",
        "--set", f"app.capacity={capacity}",
        "--set", "checkpoint.interval=1s",
        "--set", "checkpoint.mode=exactly_once",
        "--set", "rest.enabled=false",
    ]  # fmt: skip
    if mode.startswith("sync"):
        cmd += ["--set", "app.mode=sync"]
    cmd += ["--set", f"app.service={service}"] if service else ["--set", f"app.simulate={latency}"]
    samples: list[tuple[float, float]] = []
    seen: dict[Path, int] = {}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while proc.poll() is None:
        samples.append((time.monotonic() - t0, float(_count_committed(out, seen))))
        time.sleep(0.1)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{mode}: exit {proc.returncode}\n{stderr[-3000:]}")
    samples.append((wall, float(_count_committed(out, seen))))
    seqs = collections.Counter(r["seq"] for r in read_committed_output(out))
    exact = set(seqs) == set(range(events)) and max(seqs.values()) == 1
    window = steady_window(samples, float(events), bucket_s=1.0)
    return {
        "mode": mode,
        "events": events,
        "rate": window.rate if window is not None else events / wall,
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "exactly_once": exact,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=0.01)
    ap.add_argument("--capacity", type=int, default=200)
    ap.add_argument("--events", type=int, default=150_000, help="for the map_async runs")
    ap.add_argument("--sync-events", type=int, default=1_500, help="for the blocking runs")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated subset of the modes")
    args = ap.parse_args(argv)
    target = 0.8 * args.capacity / args.latency
    modes = ["async-simulated", "sync-simulated", "async-http", "sync-http"]
    if args.only:
        modes = [m for m in modes if m in args.only.split(",")]
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-async-") as tmp,
        LookupService(latency=args.latency) as svc,
    ):
        for mode in modes:
            n = args.sync_events if mode.startswith("sync") else args.events
            runs = [
                run_once(
                    Path(tmp),
                    mode=mode,
                    events=n,
                    latency=args.latency,
                    capacity=args.capacity,
                    service=svc.url if mode.endswith("http") else None,
                )
                for _ in range(args.repeats)
            ]
            rates = [r["rate"] for r in runs]
            row = {
                "mode": mode,
                "events": n,
                "rate_median": statistics.median(rates),
                "rate_min": min(rates),
                "rate_max": max(rates),
                "cpu_us_per_record": statistics.median(r["cpu_s"] / n * 1e6 for r in runs),
                "exactly_once": all(r["exactly_once"] for r in runs),
            }
            rows.append(row)
            print(
                f"{mode:16s} {row['rate_median']:>9,.0f} rec/s "
                f"({row['rate_min']:,.0f}-{row['rate_max']:,.0f}), "
                f"{row['rate_median'] / target:.2f}x target {target:,.0f}, "
                f"CPU {row['cpu_us_per_record']:.0f} us/record, "
                f"exactly-once {'yes' if row['exactly_once'] else 'NO'}",
                flush=True,
            )
    print(f"load average during the runs: {os.getloadavg()}")
    return 0 if all(r["exactly_once"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
