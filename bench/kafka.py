"""The Kafka path: one broker per bench run, one input topic, a fresh output topic per run.

The bench starts one real broker (:class:`KafkaBroker`, KRaft, loopback) for
the whole Kafka path, creates the input topic (4 partitions) and loads the
seeded events into it once (the same JSONL as the embedded path), then runs
each system of :mod:`bench.kafka_systems` (ours, bare-aiokafka, quixstreams,
faust) on it with a fresh output topic per run.

Throughput is measured from outside and alike for all, from the output
topic's end offsets (:mod:`bench.kafka_offsets`); the rate over the steady
window (10 % .. 90 % of the events) is the figure.

Exactly-once: after each run the output topic is read ``read_committed`` and
recounted against the input (:mod:`bench.kafka_recount`); in full mode (or
``--validator spark``) the project's Spark validator reads every output topic
too, in one session, after all timed runs and before the broker stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import runner
from bench.kafka_offsets import SAMPLE_EVERY_S, EndOffsetSampler
from bench.kafka_recount import overall_verdict, recount_topic
from bench.kafka_systems import KafkaSpec, KafkaSystem, KafkaWorkload, system_for
from bench.monitor import wait_for_quiet
from bench.results import RunResult, unavailable
from bench.runner import (
    Measured,
    describe_median,
    say,
    summarize_repeats,
    validate_with_spark,
    window_checkpoints,
)
from bench.stats import SteadyWindow, slowest_reader, steady_window
from bench.systems import Workload

#: Every system that runs on the Kafka path, ours first.
KAFKA_SYSTEMS = ("aiostream-ckpt", "bare-aiokafka", "quixstreams", "faust")
#: Systems that run on the Kafka path only.
KAFKA_ONLY = KAFKA_SYSTEMS[1:]
#: Partitions of the input and of every output topic.
PARTITIONS = 4


# -- which paths a bench run covers ------------------------------------------------------


def select_paths(
    path: str | None, *, full: bool, systems: Sequence[str], explicit: bool
) -> tuple[bool, bool]:
    """(embedded, kafka): which paths to run.

    ``--path`` decides when given. Otherwise full mode runs both, quick mode
    only the embedded path, and a ``--systems`` list naming a Kafka-only
    system (bare-aiokafka, quixstreams, faust) adds the Kafka path; if it
    names no embedded-only system either, the embedded path is skipped.

    >>> select_paths(None, full=False, systems=["aiostream-ckpt", "bare-loop"], explicit=False)
    (True, False)
    >>> select_paths(None, full=False, systems=["aiostream-ckpt", "faust"], explicit=True)
    (False, True)
    >>> select_paths(None, full=True, systems=["aiostream-ckpt"], explicit=True)
    (True, True)
    """
    if path is not None:
        return path in ("embedded", "both"), path in ("kafka", "both")
    names_kafka_only = explicit and any(s in KAFKA_ONLY for s in systems)
    names_embedded_only = any(s not in KAFKA_SYSTEMS for s in systems)
    kafka = full or names_kafka_only
    embedded = names_embedded_only or not names_kafka_only
    return embedded, kafka


def not_run(systems: Iterable[str], reason: str) -> list[RunResult]:
    """``unavailable`` results for Kafka systems when the Kafka path was not selected."""
    return [unavailable(s, "kafka", reason) for s in systems if s in KAFKA_SYSTEMS]


# -- running it --------------------------------------------------------------------------


def create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    from aiostream_ckpt_dev.demo.kafka import create_topics

    asyncio.run(create_topics(bootstrap, {topic: partitions}))


def measure_kafka(
    system: KafkaSystem,
    wl: KafkaWorkload,
    work: Path,
    *,
    repeats: int,
    interval_s: float,
    mode: str,
    sets: Sequence[str] = (),
    experiment: str = "compare",
    budget_s: float = 600.0,
    parallel_readers: bool = False,
) -> Measured:
    """Run ``system`` ``repeats`` times on the loaded topic; figures are medians over repeats.

    A slow peer gets fewer repeats rather than hours: no repeat starts that
    would take the system's runs past ``budget_s`` (judged by the last run).
    The repeats done are in ``config.repeats``. ``parallel_readers``: each
    worker writes its own partitions (the key-grouped scaling case): the
    steady window is the slowest partition's, as
    :func:`~bench.runner.measure`'s of the slowest reader.
    """
    res = RunResult(system=system.name, path="kafka", experiment=experiment, events=wl.events)
    m = Measured(res)
    try:
        why = system.unavailable_reason()
    except Exception as exc:  # a peer env that cannot even be created
        why = f"{type(exc).__name__}: {exc}"
    if why:
        res.status, res.reason = "unavailable", why
        say(f"{system.name} (kafka): cannot run here: {why}")
        return m
    host, port = wl.host_port
    rates, walls, rss, attempts, backgrounds = [], [], [], [], []
    cpus: list[dict[str, Any]] = []
    summed: list[float | None] = []
    windows: list[tuple[float, int] | None] = []
    spent = 0.0
    for i in range(repeats):
        if i > 0 and spent + walls[-1] > budget_s:
            say(
                f"  {system.name}: {i} of {repeats} repeats done in {spent:.0f}s; another would "
                f"pass the {budget_s:.0f}s budget per system: stopping here"
            )
            break
        run_dir = work / f"kafka-{experiment}-{system.name}-{i}"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        topic = f"pv-out-{system.name}-{i}-{uuid.uuid4().hex[:6]}"
        create_topic(wl.bootstrap, topic, wl.partitions)
        spec = KafkaSpec(
            wl,
            run_dir,
            topic,
            interval_s=interval_s,
            mode=mode,
            sets=list(sets),
            timeout=run_timeout_s(wl.events),
        )
        say(f"kafka {experiment}: {system.name} run {i + 1}/{repeats} ({wl.events:,} events) ...")
        backgrounds.append(round(wait_for_quiet(say=say, max_wait=runner.QUIET_WAIT[0]), 2))
        sampler = EndOffsetSampler(host, port, topic, wl.partitions)
        try:
            attempt = system.run(spec, sampler)
            sampler.sample_at(attempt.record.wall_s)  # the end offsets once it has exited
        finally:
            sampler.close()
        rec = attempt.record
        if rec.exit_code != 0:
            res.status = "failed"
            res.reason = (
                f"exit {rec.exit_code}{' (timed out)' if rec.timed_out else ''}: "
                + " | ".join(ln.strip() for ln in rec.tail(6).splitlines() if ln.strip())[-700:]
            )
            say(f"{system.name} (kafka): FAILED: {res.reason}")
            return m
        samples = sampler.samples
        win = steady_window(samples, float(wl.events))
        if parallel_readers:
            summed.append(round(win.rate) if win else None)
            win = slowest_partition_window(sampler.per_partition, wl.events)
            windows.append(window_checkpoints(win, attempt.completed))
        rate = win.rate if win else wl.events / rec.wall_s
        verdict = recount_topic(wl.bootstrap, topic, wl.source.paths[0])
        m.python_verdicts.append(verdict)
        m.outputs.append(Path(topic))
        rates.append(rate)
        walls.append(rec.wall_s)
        spent += rec.wall_s
        rss.append(rec.peak_rss_kb / 1024)
        cpus.append(rec.cpu)
        attempts.append((attempt, win, samples))
        say(
            f"  {rate:,.0f} events/s steady, {rec.wall_s:.1f}s wall, "
            f"peak RSS {rec.peak_rss_kb / 1024:.0f} MB, read_committed recount: {verdict.summary}"
        )
    summarize_repeats(res, wl.events, rates, walls, rss)
    order = sorted(range(len(rates)), key=rates.__getitem__)
    mid_attempt, mid_win, mid_samples = attempts[order[len(order) // 2]]
    res.config = {
        **mid_attempt.config,
        "workload": wl.describe(),
        "repeats": len(rates),
        "repeats_asked": repeats,
        "output_topics": [str(p) for p in m.outputs],
        "background_cores_before_runs": backgrounds,
        "cpu_s": cpus,
        "throughput_method": "output topic end offsets (high watermark) sampled every "
        f"{SAMPLE_EVERY_S:g}s, steady window 10-90% of the events",
    }
    if parallel_readers:
        res.config["steady_summed_events_per_s"] = summed
        res.config["steady_windows"] = windows
    describe_median(res, mid_attempt, backgrounds)
    res.series = {
        "progress": [(round(t, 3), round(v)) for t, v in mid_samples],
        "checkpoints": [(round(t, 3), cid, ms) for t, cid, ms, _ in mid_attempt.completed],
        "checkpoint_ms_all": [ms for a, _, _ in attempts for _, _, ms, _ in a.completed],
        "steady": [mid_win.t_start, mid_win.t_end] if mid_win else None,
        "bucket_rates": list(mid_win.bucket_rates) if mid_win else [],
    }
    verdicts = m.python_verdicts
    res.validator = "python"
    res.exactly_once_verified = overall_verdict([v.passed for v in verdicts])
    res.validation = {
        "python": [v.to_json() for v in verdicts],
        "summary": "; ".join(sorted({v.summary for v in verdicts})),
    }
    return m


def slowest_partition_window(
    per_partition: list[tuple[float, tuple[float, ...]]], events: int
) -> SteadyWindow | None:
    """The 10-90 % window of the output paced by its slowest partition (its share of its end)."""
    if not per_partition:
        return None
    finals = per_partition[-1][1]
    return steady_window(slowest_reader(per_partition, finals), float(events))


def run_timeout_s(events: int) -> float:
    """Longest one run may take: 10 minutes, or 1 ms per event plus 200 s when more.

    >>> run_timeout_s(50_000), run_timeout_s(1_000_000)
    (600.0, 1200.0)
    """
    return max(600.0, events / 1000 + 200.0)


@dataclass
class KafkaPlan:
    systems: list[str]
    source: Workload
    repeats: int
    interval_s: float
    mode: str
    sets: list[str]
    work: Path
    spark: bool
    partitions: int = PARTITIONS


def run_kafka_path(plan: KafkaPlan) -> list[RunResult]:
    """Start the broker, load the input topic once, measure every system, validate, stop."""
    from aiostream_ckpt_dev.demo.kafka import load_jsonl

    broker, why = start_broker(plan.work, "kafka")
    if broker is None:
        return [unavailable(s, "kafka", why or "no broker") for s in plan.systems]
    try:
        bootstrap = broker.bootstrap_servers
        src = plan.source
        topic = f"pv-in-n{src.events}-k{src.keys}-s{src.seed}-z{src.skew:g}-e{src.event_size}"
        create_topic(bootstrap, topic, plan.partitions)
        say(f"kafka: loading {src.events:,} events into {topic} ({plan.partitions} partitions) ...")
        t0 = time.monotonic()
        loaded = asyncio.run(load_jsonl(bootstrap, topic, src.paths[0]))
        wl = KafkaWorkload(bootstrap, topic, plan.partitions, src, time.monotonic() - t0)
        say(f"kafka: loaded {loaded:,} events in {wl.load_s:.1f}s ({bootstrap})")
        measured: list[Measured] = []
        for name in plan.systems:
            system = system_for(name)
            if system is None:
                measured.append(
                    Measured(unavailable(name, "kafka", f"{name} has no Kafka-path job"))
                )
                continue
            m = measure_kafka(
                system,
                wl,
                plan.work,
                repeats=plan.repeats,
                interval_s=plan.interval_s,
                mode=plan.mode,
                sets=plan.sets if name == "aiostream-ckpt" else (),
            )
            if m.result.status != "unavailable":
                with contextlib.suppress(Exception):
                    ver = system.version()
                    if ver:
                        m.result.config["version"] = ver
            measured.append(m)
        if plan.spark:
            spark_check(measured, src.paths[0], bootstrap)
        return [m.result for m in measured]
    finally:
        stop_broker(broker, plan.work, "kafka")


def start_broker(work: Path, who: str) -> tuple[Any, str | None]:
    """Start the bench's broker in ``work/kafka-broker``: (broker, None), or (None, why not)."""
    from aiostream_ckpt_dev.broker import KafkaBroker

    broker_dir = work / "kafka-broker"
    shutil.rmtree(broker_dir, ignore_errors=True)
    # The JVM's full JIT: the bench measures throughput through the broker.
    broker = KafkaBroker(broker_dir, start_timeout_s=300, heap="1g", jvm_options=())
    say(f"{who}: starting the broker ...")
    try:
        broker.start()
    except Exception as exc:
        why = f"the Kafka broker did not start: {type(exc).__name__}: {str(exc)[:400]}"
        say(why)
        return None, why
    return broker, None


def stop_broker(broker: Any, work: Path, who: str) -> None:
    say(f"{who}: stopping the broker")
    broker.close()
    shutil.rmtree(work / "kafka-broker", ignore_errors=True)


def spark_check(measured: list[Measured], input_path: Path, bootstrap: str) -> None:
    targets = [m for m in measured if m.result.status == "ok" and m.outputs]
    jobs = [
        {
            "id": f"{id(m)}-{i}",
            "input": str(input_path),
            "kafka_bootstrap": bootstrap,
            "kafka_topic": str(topic),
        }
        for m in targets
        for i, topic in enumerate(m.outputs)
    ]
    validate_with_spark(targets, jobs, "output topics, read_committed", "read_committed recount")
