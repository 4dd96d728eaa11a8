"""Workers scaling: pv_count at ``job.workers=2`` against 1, both at parallelism 2, same run.

``python -m bench.scaling [--events N] [--repeats R] [--cases file-10k,file-1m,kafka]``
(also ``python -m bench --path scaling``, and a section of ``python -m bench --full``).
Cases (the issue's bench targets):

* ``file-10k``: pv_count from a file, 10 k keys, the input line-split into 2
  files, ``key_by``: at 2 workers half the records cross to the other
  worker's count (JSON over a socket);
* ``file-10k-kg``: the same events rewritten by key group
  (``write_key_grouped``, ``app.key_grouped=1``): nothing crosses;
* ``file-1m``: as ``file-10k`` with 1 M keys;
* ``kafka``: Kafka -> Kafka exactly-once, the input topic (4 partitions)
  partitioned by ``app_id``'s key group (``KeyGroupPartitioner``), read
  with ``KafkaSource(key_grouped=True)`` and ``reinterpret_as_keyed``:
  nothing crosses; one broker for the section.

Each case runs workers=1 and workers=2 alternately (``R`` times each, the
order flipped every round, so drift in the machine's load hits both), and
every run's output is recounted exactly-once as the other rows are. Figures:
the steady rate (10-90 % of the input, as every row) and the wall rate
(start-up included), their ratios workers=2 / workers=1, and CPU seconds per
million events per process (medians over the repeats: the main process and
each worker; at workers=1 the main process runs everything), and the
CPU-bound ratio: one process's CPU against the busier worker's, the speedup
two free cores would give (the rate ratios on a shared machine are skewed by
the other processes: the scheduler gives two workers a bigger share). Python's
bytecode is cached for these runs (``PYTHONPYCACHEPREFIX``, one warm-up run)
so a worker's start-up does not include compiling the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench import runner
from bench.kafka import PARTITIONS, create_topic, measure_kafka, start_broker, stop_broker
from bench.kafka_systems import KafkaWorkload, OursKafka
from bench.results import RunResult, apply_refusal, table
from bench.runner import Measured, measure, say, summarize_repeats, validate_with_spark
from bench.scaling_report import scaling_line, section_text, target_met
from bench.systems import Ours, Workload
from bench.validation import expected_counts

CASES = ("file-10k", "file-10k-kg", "file-1m", "kafka")
#: the issue's targets, workers=2 / workers=1 steady rate
TARGETS = {"file-10k": 1.5, "file-10k-kg": 1.5, "file-1m": 1.5, "kafka": 1.7}
PARALLELISM = 2


@dataclass(frozen=True)
class Case:
    name: str
    keys: int
    key_grouped: bool
    kafka: bool = False


def case(name: str) -> Case:
    return {
        "file-10k": Case(name, 10_000, False),
        "file-10k-kg": Case(name, 10_000, True),
        "file-1m": Case(name, 1_000_000, False),
        "kafka": Case(name, 10_000, True, kafka=True),
    }[name]


def key_grouped_files(wl: Workload, parts: int) -> Workload:
    """The workload's events rewritten into ``parts`` key-grouped files (cached beside it)."""
    from aiostream_ckpt.connectors.key_grouped import write_key_grouped
    from apps.pv_count import app_id

    src = wl.paths[0]
    out = src.with_name(f"{src.stem}.kg{parts}")
    files = sorted(out.glob("kg-*.jsonl")) if out.exists() else []
    if len(files) != parts:
        shutil.rmtree(out, ignore_errors=True)
        with open(src, "rb") as f:
            files = write_key_grouped((orjson.loads(line) for line in f), app_id, out, parts=parts)
    return Workload(tuple(files), wl.events, wl.keys, wl.seed, wl.skew, wl.event_size)


def split_by_key_group(path: Path, partitions: int) -> list[list[bytes]]:
    """The lines of ``path`` per partition of their ``app_id``'s key group, in input order."""
    from aiostream_ckpt.connectors.key_grouped import KeyGroupPartitioner
    from apps.pv_count import app_id

    partitioner = KeyGroupPartitioner(app_id)
    parts: list[list[bytes]] = [[] for _ in range(partitions)]
    of_key: dict[str, int] = {}
    with open(path, "rb") as f:
        for line in f:
            key = orjson.loads(line)["app_id"]
            p = of_key.get(key)
            if p is None:
                p = of_key[key] = partitioner.partition_of_key(key, partitions)
            parts[p].append(line.rstrip(b"\n"))
    return parts


async def produce_partitions(bootstrap: str, topic: str, parts: list[list[bytes]]) -> int:
    """Produce ``parts[p]`` into partition ``p`` of ``topic``, in order; return the count."""
    from aiokafka import AIOKafkaProducer

    from aiostream_ckpt_dev.demo.kafka import send_lines

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", max_batch_size=1 << 20, linger_ms=5
    )
    await producer.start()
    try:
        futures = [
            f for p, lines in enumerate(parts) for f in await send_lines(producer, topic, p, lines)
        ]
        await producer.flush()
        for fut in futures:
            fut.result()
    finally:
        await producer.stop()
    return sum(map(len, parts))


def load_topic(bootstrap: str, topic: str, path: str) -> int:
    """Load ``path`` into ``topic`` by key group (run in a child process)."""
    parts = split_by_key_group(Path(path), PARTITIONS)
    return asyncio.run(produce_partitions(bootstrap, topic, parts))


def merge(parts: list[Measured], events: int) -> Measured:
    """One result from single-repeat measurements (alternated with the other setting)."""
    bad = next((p for p in parts if p.result.status != "ok"), None)
    if bad is not None:
        return bad
    rates = [float(p.result.events_per_s or 0) for p in parts]
    mid = sorted(range(len(parts)), key=rates.__getitem__)[len(parts) // 2]
    res = parts[mid].result
    summarize_repeats(
        res,
        events,
        rates,
        [float(p.result.wall_s or 0) for p in parts],
        [float(p.result.peak_rss_mb or 0) for p in parts],
    )
    res.config["repeats"] = len(parts)
    res.config["cpu_s"] = [c for p in parts for c in p.result.config.get("cpu_s", [])]
    summed = [r for p in parts for r in p.result.config.get("steady_summed_events_per_s", [])]
    if summed:
        res.config["steady_summed_events_per_s"] = summed
        res.config["steady_windows"] = [
            w for p in parts for w in p.result.config.get("steady_windows", [])
        ]
    res.config["background_cores_before_runs"] = [
        b for p in parts for b in p.result.config.get("background_cores_before_runs", [])
    ]
    verdicts = [p.result.exactly_once_verified for p in parts]
    res.exactly_once_verified = False if False in verdicts else (True if all(verdicts) else None)
    res.validation = {
        "python": [v for p in parts for v in p.result.validation.get("python", [])],
        "summary": "; ".join(
            sorted({p.result.validation.get("summary", "") for p in parts} - {""})
        ),
    }
    return Measured(res, [o for p in parts for o in p.outputs])


def cpu_per_million(cpus: list[dict[str, Any]], events: int) -> dict[str, Any]:
    """Medians over repeats of CPU s per million events: total, main, each worker."""
    if not cpus:
        return {}
    per_m = 1e6 / events
    workers = max(len(c.get("children_s", [])) for c in cpus)

    def med(values: list[float]) -> float:
        return round(statistics.median(values) * per_m, 2)

    out: dict[str, Any] = {
        "total": med([c["total_s"] for c in cpus]),
        "main": med([c["main_s"] for c in cpus]),
    }
    if workers:
        out["workers"] = [
            med([c["children_s"][i] for c in cpus if len(c["children_s"]) > i])
            for i in range(workers)
        ]
    return out


def summary(
    name: str,
    one: RunResult,
    two: RunResult,
    events: int,
    load_avg: tuple[float, float, float] | None = None,
) -> dict[str, Any]:
    """The case's figures; ``load_avg``: the load when its runs ended (default: now)."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    def summed(r: RunResult) -> float | None:
        rates = [x for x in r.config.get("steady_summed_events_per_s", []) if x]
        return statistics.median(rates) if rates else None

    cpu1 = cpu_per_million(one.config.get("cpu_s", []), events)
    cpu2 = cpu_per_million(two.config.get("cpu_s", []), events)
    steady = ratio(two.events_per_s, one.events_per_s)
    return {
        "case": name,
        "events": events,
        "parallelism": PARALLELISM,
        "target_steady_ratio": TARGETS.get(name),
        "steady_ratio": steady,
        "target_met": target_met(steady, TARGETS.get(name)),
        "wall_ratio": ratio(two.events_per_s_wall, one.events_per_s_wall),
        # the old figure, for comparison: the window of the summed read positions,
        # which leaves out the tail the slower worker reads alone (bench/README.md)
        "steady_summed_ratio": ratio(summed(two), summed(one)),
        # what two free cores would give a CPU-bound job: one process's CPU against
        # the busier worker's (the load on a shared machine skews the rate ratios)
        "cpu_bound_ratio": ratio(cpu1.get("total"), max(cpu2.get("workers") or [0.0])),
        "exactly_once": one.exactly_once_verified is True and two.exactly_once_verified is True,
        # who checked: "python" (the recount), "spark" (Spark and the recount, --full)
        "validators": sorted({r.validator for r in (one, two) if r.validator}),
        "load_avg": [round(x, 1) for x in load_avg or os.getloadavg()],
        **{
            f"workers_{w}": {
                "status": r.status,
                "events_per_s": r.events_per_s,
                "events_per_s_wall": r.events_per_s_wall,
                "repeats": r.events_per_s_repeats,
                "steady_windows": r.config.get("steady_windows"),
                "cpu_s_per_m_events": c,
            }
            for w, r, c in ((1, one, cpu1), (2, two, cpu2))
        },
    }


def _alternate(
    run_one: Callable[[int, int], Measured], repeats: int, events: int
) -> tuple[Measured, Measured]:
    """Run ``run_one(workers, i)`` for workers 1 and 2, alternating which goes first."""
    got: dict[int, list[Measured]] = {1: [], 2: []}
    for i in range(repeats):
        for w in (1, 2) if i % 2 == 0 else (2, 1):
            m = run_one(w, i)
            got[w].append(m)
            if m.result.status != "ok":  # a failed run ends the case; it reports why
                return merge(got[1] or [m], events), merge(got[2] or [m], events)
    return merge(got[1], events), merge(got[2], events)


@dataclass
class ScalingPlan:
    events: int
    repeats: int
    cases: list[str]
    #: the bench's work directory (input data is cached under ``data/``)
    work: Path
    interval_s: float = 1.0
    seed: int = 1
    #: also check every output with the Spark validator (``--full``), as the compare rows
    spark: bool = False


def _expected(wl: Workload) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in wl.paths:
        for k, n in expected_counts(p).items():
            counts[k] = counts.get(k, 0) + n
    return counts


def single_input(c: Case, plan: ScalingPlan) -> Workload:
    """The case's events as one file: the split and key-grouped inputs hold the same lines."""
    from bench.experiments import workload

    return workload(plan.work, plan.events, c.keys, plan.seed, 0.0, 0)


def run_file_case(c: Case, plan: ScalingPlan, work: Path) -> tuple[Measured, Measured]:
    from bench.experiments import workload

    if c.key_grouped:
        wl = key_grouped_files(single_input(c, plan), PARALLELISM)
    else:
        wl = workload(plan.work, plan.events, c.keys, plan.seed, 0.0, 0, files=PARALLELISM)
    expected = _expected(wl)

    def one(w: int, i: int) -> Measured:
        sets = [f"job.workers={w}"] + (["app.key_grouped=1"] if c.key_grouped else [])
        return measure(
            Ours(),
            wl,
            work,
            experiment=f"workers={w} {c.name}",
            label=f"-r{i}",
            repeats=1,
            spec_args={"parallelism": PARALLELISM, "interval_s": plan.interval_s, "sets": sets},
            expected=expected,
            keep_outputs=plan.spark,
            parallel_readers=True,
        )

    return _alternate(one, plan.repeats, wl.events)


def run_kafka_case(c: Case, plan: ScalingPlan, work: Path) -> tuple[Measured, Measured]:
    from bench.kafka import spark_check

    src = single_input(c, plan)
    broker, why = start_broker(work, "scaling")
    if broker is None:
        failed = Measured(RunResult("aiostream-ckpt", "kafka", status="unavailable", reason=why))
        return failed, failed
    try:
        bootstrap = broker.bootstrap_servers
        topic = f"pv-in-kg-n{src.events}-k{src.keys}-s{src.seed}-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, topic, PARTITIONS)
        t0 = time.monotonic()
        # in a child: a parent that held the 1 M lines would pass its peak RSS on to
        # every run it forks (wait4's ru_maxrss of a child starts at the parent's)
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            loaded = pool.apply(load_topic, (bootstrap, topic, str(src.paths[0])))
        wl = KafkaWorkload(bootstrap, topic, PARTITIONS, src, time.monotonic() - t0)
        say(f"scaling: loaded {loaded:,} events into {topic} by key group of app_id")

        def one(w: int, i: int) -> Measured:
            m = measure_kafka(
                OursKafka(),
                wl,
                work,
                repeats=1,
                interval_s=plan.interval_s,
                mode="exactly_once",
                sets=[f"job.parallelism={PARALLELISM}", f"job.workers={w}", "app.key_grouped=1"],
                experiment=f"workers={w} {c.name}",
                parallel_readers=True,
            )
            m.result.config["parallelism"] = PARALLELISM
            return m

        runs = _alternate(one, plan.repeats, wl.events)
        if plan.spark:  # the output topics live as long as the broker
            spark_check(list(runs), src.paths[0], bootstrap)
        return runs
    finally:
        stop_broker(broker, work, "scaling")


def _warm_up(plan: ScalingPlan, work: Path) -> None:
    """One small run at 2 workers: the bytecode cache then holds what every process imports."""
    from bench.experiments import workload
    from bench.systems import RunSpec

    wl = workload(plan.work, 20_000, 1000, plan.seed, 0.0, 0, files=PARALLELISM)
    run_dir = work / "warm-up"
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = RunSpec(wl, run_dir, parallelism=PARALLELISM, sets=["job.workers=2"])
    rec = Ours().run(spec).record
    if rec.exit_code != 0:
        say(f"scaling: the warm-up run failed ({rec.exit_code}): {rec.tail(3)}")


def run_scaling(plan: ScalingPlan) -> tuple[list[RunResult], list[dict[str, Any]]]:
    """Run the cases; return their rows (workers=1 and 2 each) and one summary per case."""
    work = plan.work / "run-scaling"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    saved = {k: os.environ.get(k) for k in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")}
    os.environ["PYTHONPYCACHEPREFIX"] = str(plan.work / "pycache")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    done: list[tuple[str, Measured, Measured, tuple[float, float, float]]] = []
    try:
        _warm_up(plan, work)
        for name in plan.cases:
            c = case(name)
            say(f"scaling: {name} ({plan.events:,} events, {c.keys:,} keys), workers 1 vs 2")
            one, two = (run_kafka_case if c.kafka else run_file_case)(c, plan, work)
            for m in (one, two):
                apply_refusal(m.result)
            done.append((name, one, two, os.getloadavg()))
            say(f"  {scaling_line(summary(name, one.result, two.result, plan.events))}")
        if plan.spark:
            _spark_check_files(plan, [d[:3] for d in done if not case(d[0]).kafka])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    runs: list[RunResult] = []
    summaries: list[dict[str, Any]] = []
    for name, one, two, load in done:
        for m in (one, two):
            apply_refusal(m.result)  # again: Spark may have found what the recount did not
        # the load when the case's runs ended, not after the Spark session
        summaries.append(summary(name, one.result, two.result, plan.events, load))
        annotate(one.result, two.result, summaries[-1])
        runs += [one.result, two.result]
    return runs, summaries


def _spark_check_files(plan: ScalingPlan, done: list[tuple[str, Measured, Measured]]) -> None:
    """The file cases' outputs against their input, in one Spark session."""
    targets = [m for _, one, two in done for m in (one, two) if m.result.status == "ok"]
    jobs = [
        {
            "id": f"{id(m)}-{i}",
            "input": str(single_input(case(name), plan).paths[0]),
            "output": str(o),
        }
        for name, one, two in done
        for m in (one, two)
        if m.result.status == "ok"
        for i, o in enumerate(m.outputs)
    ]
    validate_with_spark(targets, jobs, "workers scaling outputs", "Python recount")


def annotate(one: RunResult, two: RunResult, s: dict[str, Any]) -> None:
    """Put the case's figures on its two rows (``config["workers_scaling"]``) for the table."""
    one.config["workers_scaling"] = {
        "workers": 1,
        "cpu_s_per_m_events": s["workers_1"]["cpu_s_per_m_events"],
    }
    two.config["workers_scaling"] = {
        "workers": 2,
        **{
            k: s[k]
            for k in ("steady_ratio", "target_steady_ratio", "target_met", "cpu_bound_ratio")
        },
        "cpu_s_per_m_events": s["workers_2"]["cpu_s_per_m_events"],
    }


def main(argv: list[str] | None = None) -> int:
    from bench.peers_env import BENCH_DIR

    ap = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated of {CASES}")
    ap.add_argument("--interval", type=float, default=1.0, help="checkpoint interval, seconds")
    ap.add_argument("--work", type=Path, default=BENCH_DIR / ".work")
    ap.add_argument("--quiet-wait", type=float, default=0.0, help="see python -m bench")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--spark", action="store_true", help="check outputs with Spark too (--full)")
    args = ap.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {CASES}")
    runner.QUIET_WAIT[0] = args.quiet_wait
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(128 << 20))
    plan = ScalingPlan(
        args.events, args.repeats, cases, args.work.resolve(), args.interval, spark=args.spark
    )
    runs, summaries = run_scaling(plan)
    print(table(runs))
    print(section_text(summaries))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"runs": [r.to_json() for r in runs], "workers_scaling": summaries}
        args.json.write_text(json.dumps(doc, indent=2, default=str))
    return 0 if all(r.status == "ok" for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
