"""Enrichment throughput: ``map_async`` next to the same lookup as a blocking ``map``.

``python -m bench.async_io [--latency 0.01] [--capacity 200] [--events N] [--repeats 3]``
runs ``apps/enrich.py`` (JSON-lines file source -> lookup -> exactly-once file
sink, 1 s exactly-once checkpoints, one subtask) four ways: ``map_async`` and a
blocking ``map``, each against the real HTTP lookup service
(``aiostream_ckpt_dev.lookup_service``, aiohttp, on a loopback port, in
this process) and against a simulated service (an ``asyncio.sleep`` /
``time.sleep`` of the same latency inside the job, no HTTP: the operator's
own ceiling). Throughput is committed output records from the first to the
last checkpoint's commit inside 10 %..90 % of the records (``step_rate``: the
output grows in one step per checkpoint), from the sink's committed files
polled every 100 ms; every run's committed output is checked to hold each
input record exactly once. CPU per record is the job's user+sys time beyond
that of a run of ``--base-events`` records (start-up, imports, first
checkpoint), so ``1e6 / cpu_us`` is the rate one free core would allow. The
target per subtask is ``0.8 * capacity / latency``.
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
from bench.stats import step_rate

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
    own_before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while proc.poll() is None:
        samples.append((time.monotonic() - t0, float(_count_committed(out, seen))))
        time.sleep(0.1)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    own_after = resource.getrusage(resource.RUSAGE_SELF)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{mode}: exit {proc.returncode}\n{stderr[-3000:]}")
    samples.append((wall, float(_count_committed(out, seen))))
    seqs = collections.Counter(r["seq"] for r in read_committed_output(out))
    exact = set(seqs) == set(range(events)) and max(seqs.values()) == 1
    return {
        "mode": mode,
        "events": events,
        "rate": step_rate(samples, float(events)),
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        # this process: the HTTP service's thread (and the ~10 polls a second)
        "service_cpu_s": (own_after.ru_utime - own_before.ru_utime)
        + (own_after.ru_stime - own_before.ru_stime),
        "exactly_once": exact,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=0.01)
    ap.add_argument("--capacity", type=int, default=200)
    ap.add_argument("--events", type=int, default=150_000, help="for the map_async runs")
    ap.add_argument("--sync-events", type=int, default=1_500, help="for the blocking runs")
    ap.add_argument("--base-events", type=int, default=500, help="the start-up cost's run")
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

            def run(events: int, mode: str = mode) -> dict[str, Any]:
                url = svc.url if mode.endswith("http") else None
                return run_once(
                    Path(tmp),
                    mode=mode,
                    events=events,
                    latency=args.latency,
                    capacity=args.capacity,
                    service=url,
                )

            base = run(args.base_events)
            runs = [run(n) for _ in range(args.repeats)]
            rates = [r["rate"] for r in runs if r["rate"] is not None]
            cpu_us = statistics.median(
                (r["cpu_s"] - base["cpu_s"]) / (n - args.base_events) * 1e6 for r in runs
            )
            service_us = statistics.median(r["service_cpu_s"] / n * 1e6 for r in runs)
            row = {
                "mode": mode,
                "events": n,
                "rate_median": statistics.median(rates) if rates else None,
                "cpu_us_per_record": cpu_us,
                "exactly_once": all(r["exactly_once"] for r in (base, *runs)),
            }
            rows.append(row)
            rate = (
                f"{row['rate_median']:>9,.0f} rec/s ({min(rates):,.0f}-{max(rates):,.0f}), "
                f"{row['rate_median'] / target:.2f}x target {target:,.0f}"
                if rates
                else "too few checkpoints inside the window for a rate (more --events)"
            )
            print(
                f"{mode:16s} {rate}, CPU {cpu_us:.1f} us/record beyond start-up "
                f"({base['cpu_s']:.2f} s): one core allows {1e6 / cpu_us:,.0f} rec/s, "
                f"exactly-once {'yes' if row['exactly_once'] else 'NO'}"
                + (f"; service CPU {service_us:.0f} us/request" if mode.endswith("http") else ""),
                flush=True,
            )
    print(f"load average during the runs: {os.getloadavg()}")
    return 0 if all(r["exactly_once"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
