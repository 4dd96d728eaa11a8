"""``python -m bench``: load-test pv_count on ours and the peers; print, plot, write JSON.

Quick mode (default, < 3 minutes): ours, bare-loop and Bytewax on the embedded
path, 1 M events, 3 repeats, one kill -9 recovery and a short latency run.
Full mode (``--full``): also PyFlink, 5 repeats, Spark validation, the
scaling curves (parallelism, key count, checkpoint interval, state size with
full vs incremental checkpoints) and the Kafka path (ours, bare-aiokafka,
Quix Streams, Faust on one local broker) and the workers scaling rows
(``job.workers`` 2 vs 1, :mod:`bench.scaling`). ``--systems`` naming a
Kafka-only system, or ``--path kafka|both``, runs the Kafka path in any mode;
``--path scaling`` runs only the workers scaling rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from bench import kafka
from bench.experiments import Plan, run_plan, workload
from bench.peers_env import BENCH_DIR
from bench.results import (
    SYSTEMS,
    RunResult,
    apply_refusal,
    compute_ratios,
    document,
    table,
    validate_document,
)
from bench.runner import say


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the < 3 minute run (default)")
    mode.add_argument("--full", action="store_true", help="peers, scaling curves, Spark checks")
    p.add_argument("--json", type=Path, help="write the results document here")
    p.add_argument("--plots", type=Path, help="PNG directory (default WORK/plots)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--work", type=Path, default=BENCH_DIR / ".work", help="scratch directory")
    p.add_argument("--systems", help=f"comma-separated subset of {','.join(SYSTEMS)}")
    p.add_argument(
        "--path",
        choices=("embedded", "kafka", "both", "scaling"),
        help="which path(s) to run (default: quick embedded; full both and the workers "
        "scaling rows; a --systems list naming bare-aiokafka, quixstreams or faust adds "
        "kafka; scaling: only the job.workers 2 vs 1 rows, bench/scaling.py)",
    )
    p.add_argument("--events", type=int, help="events in the compare workload (default 1M)")
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--skew", type=float, default=0.0, help="Zipf exponent of key popularity")
    p.add_argument("--event-size", type=int, default=0, help="padding bytes per event")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeats", type=int, help="repeats per system (quick 3, full 5)")
    p.add_argument("--parallelism", type=int, default=1, help="ours: job.parallelism")
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="checkpoint/snapshot interval in seconds (0 = off) for every system",
    )
    p.add_argument("--mode", choices=("exactly_once", "at_least_once"), default="exactly_once")
    p.add_argument(
        "--app",
        default="apps.pv_count",
        help="app module run by ours (gets app.input and app.output)",
    )
    p.add_argument(
        "--app-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra --set for ours (repeatable), e.g. state.cache_max_entries=...",
    )
    p.add_argument(
        "--validator",
        choices=("auto", "spark", "python"),
        default="auto",
        help="auto: Spark for the compare runs in full mode, Python recount otherwise",
    )
    p.add_argument("--rate", type=float, help="paced rate for the latency run (events/s)")
    p.add_argument("--no-recovery", action="store_true")
    p.add_argument("--no-latency", action="store_true")
    p.add_argument(
        "--engine-rev",
        metavar="REV",
        help="run ours from this git revision (exported with git archive) instead of "
        "the working tree, e.g. HEAD while others edit the tree",
    )
    p.add_argument(
        "--no-malloc-tune",
        action="store_true",
        help="do not set MALLOC_TRIM_THRESHOLD_ for the workers (see README)",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=None,
        help="seconds to wait for a quiet machine before each timed run (quick 20, full 60)",
    )
    p.add_argument("--keep", action="store_true", help="keep run directories (outputs, logs)")
    p.add_argument(
        "--soak",
        type=float,
        metavar="MINUTES",
        help="instead of the load test: run pv_count and a windowed app at a steady paced "
        "load for MINUTES, sample RSS, state and checkpoint bytes and throughput, report "
        "their slopes after warm-up (bench/soak.py)",
    )
    p.add_argument("--soak-rate", type=float, default=20_000.0, help="events/s per soaked app")
    p.add_argument("--soak-keys", type=int, default=10_000, help="keys of the soaked apps")
    p.add_argument(
        "--soak-warmup", type=float, help="minutes left out of the slopes (default: min(5, 1/4))"
    )
    p.add_argument(
        "--no-windows",
        action="store_true",
        help="skip the windowed throughput rows (tumbling and session windows on the same input)",
    )
    return p


def soak_main(args: argparse.Namespace) -> int:
    """``--soak``: run bench/soak.py, print the slopes, write JSON and the plot."""
    from bench.soak import run_soak
    from bench.soak import table as soak_table

    work = args.work.resolve() / "run-soak"
    shutil.rmtree(work, ignore_errors=True)
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(128 << 20))
    doc = run_soak(
        args.soak, work, rate=args.soak_rate, keys=args.soak_keys, warmup_min=args.soak_warmup
    )
    print(soak_table(doc))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2))
        say(f"soak results written to {args.json}")
    if not args.no_plots:
        from bench.plots import draw_soak

        drawn = draw_soak(doc, args.plots or args.work.resolve() / "plots")
        say(drawn if isinstance(drawn, str) else "plots: " + ", ".join(map(str, drawn)))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(a["flat"] for a in doc["apps"]) else 1


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.soak is not None:
        return soak_main(args)
    full = bool(args.full)
    systems = (
        args.systems.split(",")
        if args.systems
        else ["aiostream-ckpt", "bare-loop", "bytewax"] + (["pyflink"] if full else [])
    )
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        print(f"python -m bench: unknown system(s) {unknown}; known: {SYSTEMS}", file=sys.stderr)
        return 2
    run_embedded, run_kafka = kafka.select_paths(
        args.path, full=full, systems=systems, explicit=bool(args.systems)
    )
    named = systems if args.systems else kafka.KAFKA_SYSTEMS
    kafka_systems = [s for s in named if s in kafka.KAFKA_SYSTEMS]
    embedded_systems = [s for s in systems if s not in kafka.KAFKA_ONLY]
    plan = Plan(
        full=full,
        systems=embedded_systems,
        events=args.events or 1_000_000,
        keys=args.keys,
        skew=args.skew,
        event_size=args.event_size,
        seed=args.seed,
        repeats=args.repeats or (5 if full else 3),
        parallelism=args.parallelism,
        interval=args.interval,
        mode=args.mode,
        app=args.app,
        app_sets=list(args.app_set),
        validator=args.validator,
        latency_rate=args.rate,
        recovery=not args.no_recovery,
        latency=not args.no_latency,
        work=args.work.resolve(),
        windows=not args.no_windows,
    )
    plan.work.mkdir(parents=True, exist_ok=True)
    if not args.no_malloc_tune:
        # glibc trims the heap after every large free: on this VM that is ~1.5 s of brk()
        # per million events for any CPython loop. Every system's worker inherits this.
        os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(128 << 20))
    plan.extra["MALLOC_TRIM_THRESHOLD_"] = os.environ.get("MALLOC_TRIM_THRESHOLD_")
    from bench import runner

    runner.QUIET_WAIT[0] = (
        args.quiet_wait if args.quiet_wait is not None else (60.0 if full else 20.0)
    )
    if args.engine_rev:
        from bench.systems import ENGINE_SRC, export_engine

        ENGINE_SRC[0] = export_engine(args.engine_rev, plan.work)
        plan.extra["engine"] = f"{args.engine_rev} ({ENGINE_SRC[0].name})"
        say(f"ours runs from {ENGINE_SRC[0]}")
    else:
        plan.extra["engine"] = "working tree"
    plan.extra["paths"] = [p for p, on in (("embedded", run_embedded), ("kafka", run_kafka)) if on]
    runs: list[RunResult] = []
    latencies: list[float] = []
    if run_embedded:
        runs, latencies = run_plan(plan)
    if run_kafka:
        plan.extra["kafka_systems"] = kafka_systems
        runs += kafka.run_kafka_path(
            kafka.KafkaPlan(
                systems=kafka_systems,
                source=workload(
                    plan.work, plan.events, plan.keys, plan.seed, plan.skew, plan.event_size
                ),
                repeats=plan.repeats,
                interval_s=plan.interval,
                mode=plan.mode,
                sets=plan.app_sets,
                work=plan.work / "run-current",
                spark=plan.spark,
            )
        )
    else:
        why = (
            "--path embedded was given"
            if args.path == "embedded"
            else "quick mode is embedded-only (run with --full, --path kafka, "
            "or --systems naming bare-aiokafka, quixstreams or faust)"
        )
        if args.path != "scaling":
            runs += kafka.not_run(kafka_systems, f"Kafka path not run: {why}")
    scaling: list[dict[str, Any]] = []
    if full or args.path == "scaling":
        from bench.scaling import CASES, ScalingPlan, run_scaling

        scaling_runs, scaling = run_scaling(
            ScalingPlan(
                plan.events,
                min(plan.repeats, 3),
                list(CASES),
                plan.work,
                plan.interval,
                plan.seed,
                spark=plan.spark,
            )
        )
        runs += scaling_runs
    for r in runs:
        apply_refusal(r)
    compute_ratios(runs)
    params = plan.describe()
    doc = document(runs, mode="full" if full else "quick", params=params)
    if scaling:
        doc["workers_scaling"] = scaling
    validate_document(doc)
    print(table(runs))
    if scaling:
        from bench.scaling_report import section_text

        print(section_text(scaling))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2, default=str))
        say(f"results written to {args.json}")
    if not args.no_plots:
        from bench.plots import draw

        drawn = draw(doc, latencies, args.plots or plan.work / "plots")
        say(drawn if isinstance(drawn, str) else "plots: " + ", ".join(map(str, drawn)))
    if not args.keep:
        for d in plan.work.glob("run-*"):
            shutil.rmtree(d, ignore_errors=True)
    return 0 if all(r.status in ("ok", "unavailable") for r in runs) else 1


def _describe(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items())
