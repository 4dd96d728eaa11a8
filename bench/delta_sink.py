"""pv_count into a Delta table vs into JSON-lines files, and Spark reading each result.

``python -m bench.delta_sink [--events N] [--pairs P] [--json out.json]``
(under ``cpu-lock/exclusive``) generates N events once, then runs
``aiostream-ckpt run apps.pv_count`` P times into each sink, alternating
(files, delta, files, delta, ...), and reports each pair's ratio of wall time
and of the child's CPU time (user + system), with the median of the pairs:
the cost of the Delta sink's Parquet writes and per-checkpoint commit over
the JSON-lines sink's appends and renames, in one quiet window. Then one
SparkSession with Delta Lake for Spark reads each result P times,
alternating, as a consumer would: every record, and the latest count per
app_id (``spark.read.format("delta")`` vs ``spark.read.json`` with the
schema given), the session's start timed apart.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiostream_ckpt.connectors.generator import write_generated_jsonl
from aiostream_ckpt_dev.recount import python_recount

SINKS = ("files", "delta")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_once(sink: str, inp: Path, work: Path, interval: str) -> tuple[float, float, Path]:
    """Run pv_count once into ``sink``; return (wall s, CPU s, output path)."""
    out = work / f"out-{sink}"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(work / "ckpt", ignore_errors=True)
    sets = [
        f"app.input={inp}",
        f"app.output={out}",
        f"app.sink={sink}",
        f"checkpoint.dir={work / 'ckpt'}",
        f"checkpoint.interval={interval}",
        "rest.port=0",
    ]
    cmd = [sys.executable, "-m", "aiostream_ckpt.daemon.cli", "run", "apps.pv_count"]
    cmd += [a for s in sets for a in ("--set", s)]
    cpu, started = _cpu(), time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"pv_count into {sink} failed:\n{proc.stderr[-3000:]}")
    return wall, _cpu() - cpu, out


def spark_reads(outputs: dict[str, Path], pairs: int) -> dict[str, Any]:
    """Time Spark reading each output: all records, and the latest count per key."""
    from pyspark.sql import functions as F

    from aiostream_ckpt_dev.validate.session import get_spark, stop_spark

    started = time.monotonic()
    spark = get_spark("local[2]", delta=True)
    startup = time.monotonic() - started
    jsonl = sorted(str(p) for p in outputs["files"].glob("part-*.jsonl"))

    def read(sink: str) -> tuple[float, int]:
        t = time.monotonic()
        if sink == "delta":
            df = spark.read.format("delta").load(str(outputs["delta"]))
        else:
            df = spark.read.schema("app_id string, pv long").json(jsonl)
        rows = df.count()
        df.groupBy("app_id").agg(F.max("pv")).collect()
        return time.monotonic() - t, rows

    times: dict[str, list[float]] = {s: [] for s in SINKS}
    rows: dict[str, int] = {}
    read("files"), read("delta")  # warm: the first query of a session plans and JITs
    for _ in range(pairs):
        for sink in SINKS:
            seconds, rows[sink] = read(sink)
            times[sink].append(seconds)
    stop_spark()
    ratios = [d / f for f, d in zip(times["files"], times["delta"], strict=True)]
    return {
        "spark_startup_s": round(startup, 2),
        "read_s": {s: [round(x, 3) for x in v] for s, v in times.items()},
        "rows": rows,
        "read_ratio_delta_over_files": [round(r, 3) for r in ratios],
        "read_ratio_median": round(statistics.median(ratios), 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.delta_sink", description=__doc__)
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--interval", default="1s", help="checkpoint interval")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-delta-"))
    try:
        inp = work / "in.jsonl"
        write_generated_jsonl(inp, args.events, seed=1, keys=args.keys)
        load = os.getloadavg()[0]
        runs: dict[str, list[tuple[float, float]]] = {s: [] for s in SINKS}
        outputs: dict[str, Path] = {}
        for _ in range(args.pairs):
            for sink in SINKS:
                wall, cpu, outputs[sink] = run_once(sink, inp, work, args.interval)
                runs[sink].append((wall, cpu))
                print(f"{sink:>6}: {wall:6.2f} s wall, {cpu:6.2f} s CPU", flush=True)
        wall_ratios = [d[0] / f[0] for f, d in zip(runs["files"], runs["delta"], strict=True)]
        cpu_ratios = [d[1] / f[1] for f, d in zip(runs["files"], runs["delta"], strict=True)]
        result: dict[str, Any] = {
            "events": args.events,
            "keys": args.keys,
            "checkpoint_interval": args.interval,
            "load_at_start": round(load, 2),
            "runs": {s: [[round(w, 3), round(c, 3)] for w, c in v] for s, v in runs.items()},
            "wall_ratio_delta_over_files": [round(r, 3) for r in wall_ratios],
            "cpu_ratio_delta_over_files": [round(r, 3) for r in cpu_ratios],
            "wall_ratio_median": round(statistics.median(wall_ratios), 3),
            "cpu_ratio_median": round(statistics.median(cpu_ratios), 3),
            "events_per_s_median": {
                s: round(args.events / statistics.median(w for w, _ in v)) for s, v in runs.items()
            },
        }
        result["exactly_once"] = {  # the last run of each, recounted from the input
            s: python_recount([inp], out).passed for s, out in outputs.items()
        }
        result["spark"] = spark_reads(outputs, args.pairs)
        result["load_at_end"] = round(os.getloadavg()[0], 2)
        text = json.dumps(result, indent=2)
        print(text)
        if args.json is not None:
            args.json.write_text(text + "\n")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
