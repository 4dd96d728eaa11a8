"""``python -m bench.idle_cpu``: the CPU a daemon uses when its load is low or zero.

A daemon runs for weeks, mostly below its peak; then it must cost next to
nothing. A spin does not show in a throughput bench: a paced source that slept
0.2 ms between records (uvloop returns from a sleep under 1 ms at once) used
12.8 s of CPU over 21 s at 5,000 events/s, 1.6 s once fixed (6fb757c).

Each situation runs ``aiostream-ckpt run`` on generated input that does not
end (``app.generate`` 10^12), paced by ``app.rate``, with the default 1 s
checkpoints; after ``--warmup`` seconds the user + system CPU of the process
tree (main process and workers, from ``/proc``) is read over ``--seconds``.
Reported: % of a core for the tree and per process; for paced rows, CPU ms
per 1,000 events. Targets (``limit``, % of a core per process): idle ≤ 2
(parallelism 8: ≤ 4, its 16 tasks take 16 snapshots a second), 10 events/s
≤ 2.5, 5,000 events/s ≤ 25 (the pacer's spin took 36-68); 1,000 events/s is
reported, not judged. Exit status 1 if a row is over.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.monitor import process_tree
from bench.runner import say
from bench.soak import cpu_seconds
from bench.systems import ENGINE_SRC, export_engine, ours_env_cwd


@dataclass(frozen=True)
class Situation:
    name: str
    app: str
    settings: dict[str, str]
    #: events per second (0: idle, one event every 10 s)
    rate: float
    #: % of a core per process the row must stay under (None: reported only)
    limit: float | None


SITUATIONS = (
    Situation("idle", "apps.pv_count", {}, 0, 2.0),
    Situation("idle-sessions", "apps.window_count", {"app.window": "session"}, 0, 2.0),
    Situation(
        "idle-2-workers",
        "apps.pv_count",
        {"job.parallelism": "2", "job.workers": "2", "app.splits": "2"},
        0,
        2.0,
    ),
    Situation("idle-p8", "apps.pv_count", {"job.parallelism": "8", "app.splits": "8"}, 0, 4.0),
    Situation("paced-10", "apps.pv_count", {}, 10, 2.5),
    Situation("paced-1000", "apps.pv_count", {}, 1000, None),
    # the pacer's old spin (6fb757c~1, 0.2 ms sleeps): 36-68 % of a core; now ~7 %
    Situation("paced-5000", "apps.pv_count", {}, 5000, 25.0),
)

#: the rate of an "idle" row: a record now and then, so the source is read and paced
IDLE_RATE = 0.1


def tree_cpu(root: int) -> tuple[float, int]:
    """CPU seconds used so far by ``root``'s live process tree, and how many processes it has."""
    pids = process_tree(root)
    return cpu_seconds(pids), len(pids)


def measure(s: Situation, work: Path, *, warmup: float, seconds: float) -> dict[str, Any]:
    """Run ``s`` and return its row."""
    run = Path(tempfile.mkdtemp(prefix="idle-", dir=work))
    settings = {
        "app.generate": str(10**12),
        "app.rate": str(s.rate or IDLE_RATE),
        "app.output": str(run / "out"),
        "checkpoint.dir": str(run / "ckpt"),
        "state.local_dir": str(run / "state"),
        "rest.port": "0",  # the daemon as deployed, on a port of its own
        **s.settings,
    }
    cmd = [sys.executable, "-m", "aiostream_ckpt.daemon.cli", "run", s.app]
    for key, value in settings.items():
        cmd += ["--set", f"{key}={value}"]
    env, cwd = ours_env_cwd()
    with open(run / "stderr.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=log)
    try:
        time.sleep(warmup)
        c0, _ = tree_cpu(proc.pid)
        t0 = time.monotonic()
        time.sleep(seconds)
        c1, procs = tree_cpu(proc.pid)
        wall = time.monotonic() - t0
        if proc.poll() is not None:
            tail = (run / "stderr.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{s.name}: the daemon exited ({proc.returncode}):\n{tail}")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(run, ignore_errors=True)
    return row(s, cpu_s=c1 - c0, wall_s=wall, processes=procs)


def row(s: Situation, *, cpu_s: float, wall_s: float, processes: int) -> dict[str, Any]:
    """A situation's figures and verdict from the CPU seconds its tree used over ``wall_s``."""
    pct = 100 * cpu_s / wall_s
    per_process = pct / processes
    return {
        "situation": s.name,
        "app": s.app,
        "settings": s.settings,
        "rate": s.rate,
        "cpu_s": round(cpu_s, 3),
        "wall_s": round(wall_s, 1),
        "processes": processes,
        "pct_of_core": round(pct, 2),
        "pct_per_process": round(per_process, 2),
        "cpu_ms_per_1000_events": round(1e6 * cpu_s / (s.rate * wall_s), 1) if s.rate else None,
        "limit_pct_per_process": s.limit,
        "ok": s.limit is None or per_process <= s.limit,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'situation':<24} {'% core':>7} {'procs':>5} {'%/proc':>7} {'limit':>6} "
        f"{'ms/1k ev':>8}  verdict"
    ]
    for r in rows:
        limit = "-" if r["limit_pct_per_process"] is None else f"{r['limit_pct_per_process']:g}"
        per_k = "-" if r["cpu_ms_per_1000_events"] is None else f"{r['cpu_ms_per_1000_events']:g}"
        verdict = "ok" if r["ok"] else "OVER"
        lines.append(
            f"{r['situation']:<24} {r['pct_of_core']:>7.2f} {r['processes']:>5} "
            f"{r['pct_per_process']:>7.2f} {limit:>6} {per_k:>8}  {verdict}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.idle_cpu", description=__doc__.splitlines()[0]
    )
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds per situation")
    p.add_argument("--warmup", type=float, default=6.0, help="seconds before measuring")
    names = ",".join(s.name for s in SITUATIONS)
    p.add_argument("--only", help=f"comma-separated situations of {names} (default: all)")
    p.add_argument("--json", type=Path, help="write the rows here")
    p.add_argument("--engine-rev", help="run ours from this git revision (as `python -m bench`)")
    args = p.parse_args(argv)
    wanted = args.only.split(",") if args.only else [s.name for s in SITUATIONS]
    unknown = set(wanted) - {s.name for s in SITUATIONS}
    if unknown:
        p.error(f"--only: no situation {', '.join(sorted(unknown))}")
    chosen = [s for s in SITUATIONS if s.name in wanted]
    work = Path(tempfile.mkdtemp(prefix="bench-idle-cpu-"))
    rows = []
    try:
        if args.engine_rev:
            ENGINE_SRC[0] = export_engine(args.engine_rev, work)
            say(f"ours runs from {ENGINE_SRC[0]}")
        for s in chosen:
            say(f"idle_cpu: {s.name} ({args.warmup:g} + {args.seconds:g} s)")
            rows.append(measure(s, work, warmup=args.warmup, seconds=args.seconds))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows}, indent=2))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
