"""Enrichment throughput: ``map_async`` next to the same lookup as a blocking ``map``.

``python -m bench.async_io [--latency 0.01] [--capacity 200] [--events N] [--repeats 3]``
runs ``apps/enrich.py`` (JSON-lines file source -> lookup -> exactly-once file
sink, 1 s exactly-once checkpoints, one subtask) in the rows of ``ROWS``,
named ``{async|sync}-{client}@{service}``: ``map_async`` or a blocking
``map``; the client aiohttp's, ``lean`` (``apps/keepalive_http.py``, keep-alive
connections on an asyncio protocol) or a blocking ``http.client`` one; the
service aiohttp's (``aiostream_ckpt_dev.lookup_service``, what the tests use)
or a lean HTTP/1.1 server (``lean_lookup_service``), either on a loopback port
in this process, on its own loop. ``*-simulated`` rows wait the latency in the
job (``asyncio.sleep`` / ``time.sleep``, no HTTP): the operator's own ceiling.
The blocking rows run with ``job.batch_size=--sync-batch``: a blocking map
holds a barrier until its batch is done, and 2048 records of 10 ms would
space the checkpoints 20 s apart.

Throughput is committed output records from the first to the last
checkpoint's commit inside 10 %..90 % of the records (``step_rate``: the
output grows in one step per checkpoint), from the sink's committed files
polled every 100 ms; with fewer than two commits inside (a slow row: the
barrier waits behind up to ``channel_capacity x batch_size`` buffered
records), the extra records over the extra wall time beyond the start-up
run (``marginal_rate``, labelled). Every run's committed output is checked
to hold each input record exactly once. CPU per record is the job's user+sys time beyond
that of a run of ``--base-events`` records (start-up, imports, first
checkpoint), so ``1e6 / cpu_us`` is the rate one free core would allow; the
service's is this process's CPU per request. The target per subtask is
``0.8 * capacity / latency``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiostream_ckpt.connectors.generator import write_generated_jsonl
from aiostream_ckpt.connectors.staging import committed_files, read_committed_output
from aiostream_ckpt_dev.lean_lookup_service import LeanLookupService
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


@dataclass(frozen=True)
class Row:
    """A way to run the lookup: ``map_async`` or a blocking ``map``; its client and service."""

    name: str
    sync: bool
    client: str | None  # aiohttp | lean | blocking; None: simulated, no HTTP
    service: str | None  # aiohttp | lean


ROWS = (
    Row("async-simulated", False, None, None),
    Row("sync-simulated", True, None, None),
    Row("async-aiohttp@aiohttp", False, "aiohttp", "aiohttp"),
    Row("async-aiohttp@lean", False, "aiohttp", "lean"),
    Row("async-lean@lean", False, "lean", "lean"),
    Row("sync-http@lean", True, "blocking", "lean"),
)


def run_once(
    work: Path,
    row: Row,
    *,
    events: int,
    latency: float,
    capacity: int,
    interval: float,
    sync_batch: int,
    service: str | None,
) -> dict[str, Any]:
    inp = work / f"in-{events}.jsonl"
    if not inp.exists():
        write_generated_jsonl(inp, events, seed=7, keys=1000)
    run_dir = Path(tempfile.mkdtemp(prefix=f"{row.name.replace('@', '-')}-", dir=work))
    out = run_dir / "out"
    cmd = [
        sys.executable, "-m", "aiostream_ckpt.daemon.cli", "run", "apps.enrich",
        "--set", f"checkpoint.dir={run_dir / 'ckpt'}",
        "--set", f"app.input={inp}",
        "--set", f"app.output={out}",
        "--set", f"app.capacity={capacity}",
        "--set", f"checkpoint.interval={interval * 1000:.0f}ms",
        "--set", "checkpoint.mode=exactly_once",
        "--set", "rest.enabled=false",
    ]  # fmt: skip
    if row.sync:
        # A blocking map holds a barrier until its batch is done: 2048 records of
        # 10 ms would put checkpoints 20 s apart, not the 1 s asked for.
        cmd += ["--set", "app.mode=sync", "--set", f"job.batch_size={sync_batch}"]
    if row.client == "lean":
        cmd += ["--set", "app.client=lean"]
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
        raise RuntimeError(f"{row.name}: exit {proc.returncode}\n{stderr[-3000:]}")
    samples.append((wall, float(_count_committed(out, seen))))
    seqs = collections.Counter(r["seq"] for r in read_committed_output(out))
    exact = set(seqs) == set(range(events)) and max(seqs.values()) == 1
    return {
        "mode": row.name,
        "events": events,
        "rate": step_rate(samples, float(events)),
        "commit_gap_s": _median_commit_gap(samples, interval),
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        # this process: the HTTP service's thread (and the ~10 polls a second)
        "service_cpu_s": (own_after.ru_utime - own_before.ru_utime)
        + (own_after.ru_stime - own_before.ru_stime),
        "exactly_once": exact,
    }


def _median_commit_gap(samples: list[tuple[float, float]], interval: float) -> float | None:
    """Median time between the committed output's steps: how often checkpoints completed.

    Rises less than half an interval apart are one commit whose files the
    polls saw land in two looks.

    >>> _median_commit_gap([(0.0, 0), (1.0, 5), (1.1, 9), (3.0, 12), (5.0, 20)], 1.0)
    2.0
    """
    rises: list[float] = []
    for (_, a), (t, b) in itertools.pairwise(samples):
        if b > a and (not rises or t - rises[-1] >= interval / 2):
            rises.append(t)
    gaps = [b - a for a, b in itertools.pairwise(rises)]
    return statistics.median(gaps) if gaps else None


def _start_services(stack: contextlib.ExitStack, rows: list[Row], latency: float) -> dict[str, str]:
    """Start the services the rows use (in this process, each on its own loop); their URLs."""
    kinds = {r.service for r in rows if r.service}
    classes = {"aiohttp": LookupService, "lean": LeanLookupService}
    return {k: stack.enter_context(classes[k](latency=latency)).url for k in sorted(kinds)}


def run_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run the selected rows (``--only``) ``--repeats`` times each; print and return them."""
    target = 0.8 * args.capacity / args.latency
    rows = [r for r in ROWS if not args.only or r.name in args.only.split(",")]
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp, contextlib.ExitStack() as st:
        urls = _start_services(st, rows, args.latency)
        for row in rows:
            n = args.sync_events if row.sync else args.events

            def run(events: int, row: Row = row) -> dict[str, Any]:
                return run_once(
                    Path(tmp),
                    row,
                    events=events,
                    latency=args.latency,
                    capacity=args.capacity,
                    interval=args.interval,
                    sync_batch=args.sync_batch,
                    service=urls[row.service] if row.service else None,
                )

            base = run(args.base_events)
            runs = [run(n) for _ in range(args.repeats)]
            result = _summary(row, n, base, runs, args.base_events)
            results.append(result)
            print(_line(result, target, base["cpu_s"]), flush=True)
    for line in _ratios(results):
        print(line)
    print(f"load average after the runs: {os.getloadavg()}")
    return results


def _summary(
    row: Row, n: int, base: dict[str, Any], runs: list[dict[str, Any]], base_events: int
) -> dict[str, Any]:
    rates = [r["rate"] for r in runs if r["rate"] is not None]
    method = "steps"
    if not rates:  # commits too far apart (a slow row: the barrier waits behind buffered input)
        rates = [marginal_rate(n - base_events, r["wall_s"] - base["wall_s"]) for r in runs]
        method = "wall beyond start-up"
    gaps = [r["commit_gap_s"] for r in runs if r["commit_gap_s"] is not None]
    return {
        "mode": row.name,
        "sync": row.sync,
        "service": row.service,
        "events": n,
        "rates": rates,
        "rate_method": method,
        "rate_median": statistics.median(rates) if rates else None,
        "commit_gap_s": statistics.median(gaps) if gaps else None,
        "cpu_us_per_record": statistics.median(
            (r["cpu_s"] - base["cpu_s"]) / (n - base_events) * 1e6 for r in runs
        ),
        "service_us_per_request": statistics.median(r["service_cpu_s"] / n * 1e6 for r in runs)
        if row.service
        else None,
        "exactly_once": all(r["exactly_once"] for r in (base, *runs)),
    }


def marginal_rate(extra_records: int, extra_wall_s: float) -> float:
    """Records per second of the run's wall time beyond the start-up run's.

    The fallback when too few commits fall inside the window for ``step_rate``:
    the extra records over the extra time, start-up and the last commit being
    in both runs (and the checkpoints' cost in the rate).

    >>> marginal_rate(19_500, 13.0)
    1500.0
    """
    return extra_records / extra_wall_s


def _line(r: dict[str, Any], target: float, base_cpu_s: float) -> str:
    rates = r["rates"]
    how = "" if r["rate_method"] == "steps" else f", {r['rate_method']}"
    rate = (
        f"{r['rate_median']:>9,.0f} rec/s ({min(rates):,.0f}-{max(rates):,.0f}{how}), "
        f"{r['rate_median'] / target:.2f}x target {target:,.0f}"
    )
    gap = f"{r['commit_gap_s']:.1f} s" if r["commit_gap_s"] is not None else "-"
    cpu = r["cpu_us_per_record"]
    service = r["service_us_per_request"]
    # A blocking row's 1,000 extra records cost less CPU than start-up varies by:
    # the wait bounds it, and its figure can come out at or below zero.
    allows = f"one core allows {1e6 / cpu:,.0f} rec/s" if cpu > 0 else "below start-up's noise"
    return (
        f"{r['mode']:22s} {rate}, commits every {gap}, CPU {cpu:.1f} us/record beyond "
        f"start-up ({base_cpu_s:.2f} s): {allows}, "
        f"exactly-once {'yes' if r['exactly_once'] else 'NO'}"
        + (f"; service CPU {service:.0f} us/request" if service is not None else "")
    )


def _ratios(results: list[dict[str, Any]]) -> list[str]:
    """Each ``map_async`` row's rate over the blocking row's with the same kind of service."""
    lines = []
    for a in results:
        sync = [
            s
            for s in results
            if s["sync"] and (s["service"] is None) == (a["service"] is None) and not a["sync"]
        ]
        if sync and a["rate_median"] and sync[0]["rate_median"]:
            ratio = a["rate_median"] / sync[0]["rate_median"]
            lines.append(f"{a['mode']} / {sync[0]['mode']}: {ratio:,.0f}x")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=0.01)
    ap.add_argument("--capacity", type=int, default=200)
    ap.add_argument("--interval", type=float, default=1.0, help="checkpoint interval, seconds")
    ap.add_argument("--events", type=int, default=150_000, help="for the map_async runs")
    ap.add_argument("--sync-events", type=int, default=1_500, help="for the blocking runs")
    ap.add_argument(
        "--sync-batch", type=int, default=20, help="job.batch_size of the blocking runs"
    )
    ap.add_argument("--base-events", type=int, default=500, help="the start-up cost's run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated subset of the rows")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    results = run_rows(parse_args(argv))
    return 0 if all(r["exactly_once"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
