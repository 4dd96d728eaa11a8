"""End-to-end latency of ours: paced generator → committed file visible to a reader.

Meaningful only with a paced source (a file read as fast as possible has no
creation times). The event's ``t`` is stamped when the source emits it; the
bench polls the output directory every 10 ms and takes the moment a committed
file appears as the moment its records became visible.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from bench.monitor import run_monitored
from bench.stats import summarize
from bench.systems import completed_from_lines, ours_env_cwd
from bench.validation import Verdict, check_pv_records


def _watch_output(out: Path, stop: threading.Event, latencies: list[float]) -> None:
    seen: set[str] = set()
    while not stop.is_set():
        try:
            names = [n for n in os.listdir(out) if n.startswith("part-") and n not in seen]
        except OSError:
            names = []
        now = time.time()
        for n in sorted(names):
            seen.add(n)
            with open(out / n, "rb") as f:
                latencies.extend(now - orjson.loads(line)["t"] for line in f if line.strip())
        time.sleep(0.01)


def measure_latency(
    run_dir: Path, *, count: int, rate: float, keys: int, interval_s: float, seed: int = 3
) -> tuple[dict[str, Any], Verdict, list[float]]:
    out = run_dir / "out"
    cmd = [
        sys.executable,
        "-m",
        "aiostream_ckpt.daemon.cli",
        "run",
        str(Path(__file__).resolve().parent / "apps_latency.py"),
    ]
    for s in (
        f"app.count={count}",
        f"app.rate={rate}",
        f"app.keys={keys}",
        f"app.seed={seed}",
        f"app.output={out}",
        f"checkpoint.dir={run_dir / 'ckpt'}",
        f"checkpoint.interval={interval_s}",
    ):
        cmd += ["--set", s]
    latencies: list[float] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_output, args=(out, stop, latencies), daemon=True)
    watcher.start()
    try:
        env, cwd = ours_env_cwd()
        rec = run_monitored(
            cmd, cwd=cwd, env=env, timeout=count / rate * 3 + 60, log_path=run_dir / "worker.log"
        )
        time.sleep(0.05)
    finally:
        stop.set()
        watcher.join(timeout=10)
    from aiostream_ckpt.connectors.generator import GeneratorSource
    from aiostream_ckpt.connectors.staging import read_committed_output

    expected: dict[str, int] = {}
    for e in GeneratorSource(count, seed=seed, keys=keys).generate(0, 0, count):
        expected[e["app_id"]] = expected.get(e["app_id"], 0) + 1
    verdict = check_pv_records(read_committed_output(out), expected)
    ms = [x * 1000 for x in latencies]
    figures = {
        "rate_events_per_s": rate,
        "events": count,
        "checkpoint_interval_s": interval_s,
        "exit_code": rec.exit_code,
        "latency_ms": summarize(ms, (50, 99, 99.9)),
        "checkpoints": len(completed_from_lines(rec.lines)),
        "definition": "source emit (wall clock) -> committed output file visible in the "
        "directory (polled every 10 ms)",
    }
    return figures, verdict, ms
