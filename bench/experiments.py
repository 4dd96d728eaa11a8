"""What quick and full mode run: the side-by-side comparison, scaling curves, recovery, latency."""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import runner
from bench.latency import measure_latency
from bench.monitor import wait_for_quiet
from bench.recovery import measure_recovery
from bench.results import RunResult
from bench.runner import Measured, measure, say, validate_with_spark
from bench.systems import BareLoop, Bytewax, Ours, RunSpec, System, Workload
from bench.validation import expected_counts, python_recount


@dataclass
class Plan:
    full: bool
    systems: list[str]
    events: int
    keys: int
    skew: float
    event_size: int
    seed: int
    repeats: int
    parallelism: int
    interval: float
    mode: str
    app: str
    app_sets: list[str]
    validator: str
    latency_rate: float | None
    recovery: bool
    latency: bool
    work: Path
    windows: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def spark(self) -> bool:
        """Whether outputs go to the Spark validator too: ``--validator spark``, or auto in full."""
        return self.validator == "spark" or (self.validator == "auto" and self.full)

    def describe(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["work"] = str(self.work)
        return d


def workload(
    work: Path, events: int, keys: int, seed: int, skew: float, event_size: int, files: int = 1
) -> Workload:
    """Seeded JSONL input, cached by its parameters; ``files`` > 1 splits it by lines."""
    from aiostream_ckpt.connectors.generator import write_generated_jsonl

    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    name = f"pv-n{events}-k{keys}-s{seed}-z{skew:g}-e{event_size}"
    path = data / f"{name}.jsonl"
    if not path.exists():
        say(f"generating {events:,} events ({keys:,} keys, skew {skew:g}) into {path} ...")
        tmp = path.with_suffix(".tmp")
        write_generated_jsonl(tmp, events, seed=seed, keys=keys, skew=skew, event_size=event_size)
        tmp.rename(path)
    paths: tuple[Path, ...] = (path,)
    if files > 1:
        parts = [data / f"{name}.part{i}of{files}.jsonl" for i in range(files)]
        if not all(p.exists() for p in parts):
            outs = [open(p, "wb") for p in parts]  # noqa: SIM115
            try:
                with open(path, "rb") as f:
                    for i, line in enumerate(f):
                        outs[i % files].write(line)
            finally:
                for o in outs:
                    o.close()
        paths = tuple(parts)
    return Workload(paths, events, keys, seed, skew, event_size)


def system_for(name: str) -> System | None:
    if name == "aiostream-ckpt":
        return Ours()
    if name == "bare-loop":
        return BareLoop()
    if name == "bytewax":
        return Bytewax()
    if name == "pyflink":
        from bench.pyflink import PyFlink

        return PyFlink()
    return None


def run_plan(plan: Plan) -> tuple[list[RunResult], list[float]]:
    work = plan.work / "run-current"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    wl = workload(plan.work, plan.events, plan.keys, plan.seed, plan.skew, plan.event_size)
    expected = expected_counts(wl.paths[0])
    ours_args = {
        "parallelism": plan.parallelism,
        "interval_s": plan.interval,
        "mode": plan.mode,
        "app": plan.app,
        "sets": plan.app_sets,
    }
    measured: list[Measured] = []
    for name in plan.systems:
        system = system_for(name)
        if system is None:
            r = RunResult(
                system=name,
                path="embedded",
                status="unavailable",
                reason=f"{name} runs on the Kafka path only",
            )
            measured.append(Measured(r))
            continue
        args = ours_args if name == "aiostream-ckpt" else {"interval_s": plan.interval}
        repeats = plan.repeats if name != "pyflink" else 1
        m = measure(
            system,
            wl,
            work,
            experiment="compare",
            repeats=repeats,
            spec_args=args,
            expected=expected,
        )
        m.result.fault_tolerance = m.result.fault_tolerance or None
        ver = system.version() if m.result.status != "unavailable" else None
        if ver:
            m.result.config["version"] = ver
        measured.append(m)
    if plan.windows and "aiostream-ckpt" in plan.systems:
        from bench.windowed import windowed_rows

        pv = next((m.result for m in measured if m.result.system == "aiostream-ckpt"), None)
        measured += windowed_rows(
            wl, work, repeats=plan.repeats, spec_args=ours_args, pv=pv if pv else None
        )
    if plan.full:
        measured += scaling(plan, work)
    latencies: list[float] = []
    extra: list[RunResult] = []
    if plan.recovery:
        extra.append(recovery_run(plan, work))
    if plan.latency:
        r, latencies = latency_run(plan, work, measured)
        extra.append(r)
    if plan.spark:
        targets = [
            m
            for m in measured
            if m.result.status == "ok" and m.outputs and m.result.experiment == "compare"
        ]
        jobs = [
            {"id": f"{id(m)}-{i}", "input": str(wl.paths[0]), "output": str(o)}
            for m in targets
            for i, o in enumerate(m.outputs)
        ]
        validate_with_spark(targets, jobs, "outputs", "Python recount")
    return [m.result for m in measured] + extra, latencies


def scaling(plan: Plan, work: Path) -> list[Measured]:
    ours = Ours()
    out: list[Measured] = []
    reps = max(2, plan.repeats // 2)
    base = {"interval_s": 1.0, "mode": plan.mode}
    for p in (1, 2):
        wl = workload(
            plan.work, plan.events, plan.keys, plan.seed, plan.skew, plan.event_size, files=p
        )
        out.append(
            measure(
                ours,
                wl,
                work,
                experiment=f"parallelism={p}",
                repeats=reps,
                spec_args={**base, "parallelism": p},
                keep_outputs=False,
            )
        )
    for keys in (1_000, 10_000, 100_000, 1_000_000):
        wl = workload(plan.work, plan.events, keys, plan.seed, plan.skew, plan.event_size)
        out.append(
            measure(
                ours,
                wl,
                work,
                experiment=f"keys={keys:.0e}",
                repeats=reps,
                spec_args=base,
                keep_outputs=False,
            )
        )
    wl = workload(plan.work, plan.events, plan.keys, plan.seed, plan.skew, plan.event_size)
    for interval in (0.0, 10.0, 1.0, 0.2):
        label = "off" if interval == 0 else f"{interval:g}s"
        out.append(
            measure(
                ours,
                wl,
                work,
                experiment=f"interval={label}",
                repeats=reps,
                spec_args={**base, "interval_s": interval},
                keep_outputs=False,
            )
        )
    for keys in (10_000, 100_000, 1_000_000):
        wl = workload(plan.work, 2 * plan.events, keys, plan.seed, plan.skew, plan.event_size)
        for full_every in (1, 10):
            kind = "full" if full_every == 1 else "incremental"
            out.append(
                measure(
                    ours,
                    wl,
                    work,
                    experiment=f"state keys={keys:.0e} {kind}",
                    repeats=1,
                    spec_args={**base, "full_every": full_every},
                    keep_outputs=False,
                )
            )
    return out


def recovery_run(plan: Plan, work: Path) -> RunResult:
    keys = 1_000_000 if plan.full else plan.keys
    # quick: 1 M events at 1 k keys end about when the first 1 s checkpoint does,
    # leaving no checkpoint to kill after
    events = 2 * plan.events if plan.full else 3 * plan.events
    wl = workload(plan.work, events, keys, plan.seed, plan.skew, plan.event_size)
    kills = 3 if plan.full else 1
    run_dir = work / "recovery"
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = RunSpec(workload=wl, run_dir=run_dir, interval_s=1.0, mode=plan.mode)
    wait_for_quiet(say=say, max_wait=runner.QUIET_WAIT[0])
    say(f"recovery: ours under {kills} kill -9 ({events:,} events, {keys:,} keys) ...")
    res = RunResult(
        system="aiostream-ckpt",
        path="embedded",
        experiment=f"recovery keys={keys:.0e}",
        events=events,
    )
    try:
        rec = measure_recovery(spec, kills=kills)
    except Exception as exc:
        res.status, res.reason = "failed", f"{type(exc).__name__}: {exc}"
        return res
    if rec["kills"] < kills:
        res.status = "failed"
        res.reason = f"the job ended after {rec['kills']} of {kills} kills (input too short)"
        return res
    verdict = python_recount(wl.paths[0], spec.out_dir)
    res.recovery = rec
    res.recovery_first_commit_s = rec["first_commit_s"]
    res.recovery_caught_up_s = rec["caught_up_s"]
    res.validator = "python"
    res.exactly_once_verified = bool(verdict.passed) and rec["exit_code"] == 0
    res.validation = {"python": [verdict.to_json()], "summary": verdict.summary}
    res.config = {"kills": kills, "checkpoint_interval_s": 1.0, "workload": wl.describe()}
    say(
        f"  recovery: first commit {rec['first_commit_s']}s, caught up {rec['caught_up_s']}s "
        f"after kill ({rec['kills']} kills); recount: {verdict.summary}"
    )
    return res


def latency_run(plan: Plan, work: Path, measured: list[Measured]) -> tuple[RunResult, list[float]]:
    ours = next(
        (
            m.result
            for m in measured
            if m.result.system == "aiostream-ckpt"
            and m.result.experiment == "compare"
            and m.result.events_per_s
        ),
        None,
    )
    rate = plan.latency_rate or (min(100_000.0, 0.5 * ours.events_per_s) if ours else 50_000.0)
    seconds = 20 if plan.full else 6
    count = int(rate * seconds)
    run_dir = work / "latency"
    run_dir.mkdir(parents=True, exist_ok=True)
    wait_for_quiet(say=say, max_wait=runner.QUIET_WAIT[0])
    say(f"latency: ours paced at {rate:,.0f} events/s for {seconds}s ...")
    res = RunResult(
        system="aiostream-ckpt",
        path="embedded",
        experiment=f"latency rate={rate:.0f}/s",
        events=count,
    )
    figures, verdict, ms = measure_latency(
        run_dir, count=count, rate=rate, keys=plan.keys, interval_s=plan.interval
    )
    res.latency = figures
    lat = figures["latency_ms"] or {}
    res.latency_ms_p50, res.latency_ms_p99 = lat.get("p50"), lat.get("p99")
    res.validator = "python"
    res.exactly_once_verified = bool(verdict.passed) and figures["exit_code"] == 0
    res.validation = {"python": [verdict.to_json()], "summary": verdict.summary}
    res.config = {"checkpoint_interval_s": plan.interval, "rate": rate}
    say(f"  latency p50 {lat.get('p50')} ms, p99 {lat.get('p99')} ms, p99.9 {lat.get('p999')} ms")
    return res, ms
