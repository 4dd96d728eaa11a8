"""Measure one system on one workload: repeats, steady-window rates, checkpoints, RSS."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.monitor import wait_for_quiet
from bench.results import RunResult
from bench.stats import SteadyWindow, median, slowest_reader, spread, steady_window, summarize
from bench.systems import Attempt, RunSpec, System, Workload
from bench.validation import Verdict, python_recount, spark_validate

#: Longest wait for a quiet machine before a timed run (set by the CLI).
QUIET_WAIT = [20.0]


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Measured:
    """A result in the making: the RunResult plus the outputs still to be checked by Spark."""

    result: RunResult
    outputs: list[Path] = field(default_factory=list)
    python_verdicts: list[Verdict] = field(default_factory=list)


def describe_median(res: RunResult, mid_attempt: Attempt, backgrounds: list[float]) -> None:
    """Busy-machine note, fault tolerance and checkpoint figures of the median repeat."""
    if max(backgrounds) > 0.25:
        res.reason = (
            f"machine was busy before some runs ({max(backgrounds):.2f} cores used by "
            "other processes): figures are pessimistic"
        )
    res.fault_tolerance = mid_attempt.fault_tolerance
    ck = checkpoint_summary(mid_attempt)
    if ck:
        res.checkpoint = ck
        dur = ck.get("duration_ms") or {}
        res.checkpoint_ms_p50, res.checkpoint_ms_p99 = dur.get("p50"), dur.get("p99")


def checkpoint_summary(attempt: Attempt) -> dict[str, Any] | None:
    """Durations from the log; sync/async/alignment/size/kind from each checkpoint's metadata."""
    if not attempt.completed and not attempt.checkpoints:
        return None
    durations = [ms for _, _, ms, _ in attempt.completed]
    sync, asyn, align = [], [], []
    full_sizes, incr_sizes = [], []
    for meta in attempt.checkpoints.values():
        tasks = meta.get("tasks", {}).values()
        if tasks:
            sync.append(max(float(t.get("sync_ms", 0)) for t in tasks))
            asyn.append(max(float(t.get("async_ms", 0)) for t in tasks))
            align.append(max(float(t.get("alignment_ms", 0)) for t in tasks))
        kinds = [
            st["keyed"].get("kind")
            for op in meta.get("operators", {}).values()
            for st in op.get("subtasks", {}).values()
            if st.get("keyed")
        ]
        size = int(meta.get("size_bytes", 0))
        (full_sizes if "full" in kinds or not kinds else incr_sizes).append(size)
    return {
        "count": len(durations),
        "duration_ms": summarize(durations),
        "sync_ms": summarize(sync),
        "async_ms": summarize(asyn),
        "alignment_ms": summarize(align),
        "size_bytes_full": summarize(full_sizes, (50,)),
        "size_bytes_incremental": summarize(incr_sizes, (50,)),
        "metadata_seen": len(attempt.checkpoints),
    }


def summarize_repeats(
    res: RunResult, events: int, rates: list[float], walls: list[float], rss: list[float]
) -> None:
    """Fill the per-system figures from its repeats: medians, spread, rate with start-up."""
    sp = spread(rates)
    res.events_per_s = median(rates)
    res.events_per_s_spread = sp.to_json() if sp else None
    res.events_per_s_repeats = [round(r) for r in rates]
    res.wall_s = median(walls)
    res.events_per_s_wall = events / res.wall_s if res.wall_s else None
    res.peak_rss_mb = median(rss)


def measure(
    system: System,
    workload: Workload,
    work: Path,
    *,
    experiment: str,
    repeats: int,
    spec_args: dict[str, Any] | None = None,
    expected: dict[str, int] | None = None,
    keep_outputs: bool = True,
    label: str = "",
    check: Callable[[Path, Path], Verdict] | None = None,
    parallel_readers: bool = False,
    before_each: Callable[[int], None] | None = None,
) -> Measured:
    """Run ``system`` ``repeats`` times; figures are medians over the repeats.

    ``check(input, output_dir)`` judges each run's output (default: the pv_count recount).
    ``parallel_readers``: the input files are read at once, one reader each (one
    per subtask or worker): the steady window is then that of the slowest
    reader's progress (:func:`~bench.stats.slowest_reader`), not of the sum.
    ``before_each(i)`` runs right before repeat ``i``, after the quiet wait (a
    reference run that the repeat is paired with).
    """
    res = RunResult(
        system=system.name, path=system.path, experiment=experiment, events=workload.events
    )
    m = Measured(res)
    why = system.unavailable_reason()
    if why:
        res.status, res.reason = "unavailable", why
        say(f"{system.name}: cannot run here: {why}")
        return m
    rates, walls, rss, attempts = [], [], [], []
    backgrounds: list[float] = []
    cpus: list[dict[str, Any]] = []
    summed: list[float | None] = []
    windows: list[tuple[float, int] | None] = []
    sizes = [float(p.stat().st_size) for p in workload.paths]
    for i in range(repeats):
        run_dir = work / f"{experiment}{label}-{system.name}-{i}"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        spec = RunSpec(workload=workload, run_dir=run_dir, **(spec_args or {}))
        say(
            f"{experiment}{label}: {system.name} run {i + 1}/{repeats} "
            f"({workload.events:,} events) ..."
        )
        background = wait_for_quiet(say=say, max_wait=QUIET_WAIT[0])
        backgrounds.append(round(background, 2))
        if before_each is not None:
            before_each(i)
        attempt = system.run(spec)
        rec = attempt.record
        if rec.exit_code != 0:
            res.status = "failed"
            res.reason = (
                f"exit {rec.exit_code}{' (timed out)' if rec.timed_out else ''}: "
                f"{rec.tail(4)[-600:]}"
            )
            say(f"{system.name}: FAILED: {res.reason}")
            return m
        bpe = workload.bytes / workload.events
        win = steady_window(rec.positions, float(workload.bytes))
        if parallel_readers:
            by_sum = win
            win = steady_window(slowest_reader(rec.reader_positions, sizes), sum(sizes))
            summed.append(round(by_sum.rate / bpe) if by_sum else None)
            windows.append(window_checkpoints(win, attempt.completed))
        rate = win.rate / bpe if win else workload.events / rec.wall_s
        rates.append(rate)
        walls.append(rec.wall_s)
        rss.append(rec.peak_rss_kb / 1024)
        cpus.append(rec.cpu)
        attempts.append((attempt, win))
        if check is not None:
            verdict = check(workload.paths[0], attempt.output_dir)
        elif len(workload.paths) == 1:
            verdict = python_recount(workload.paths[0], attempt.output_dir, expected)
        else:
            verdict = python_recount_multi(workload, attempt, expected)
        m.python_verdicts.append(verdict)
        if keep_outputs:
            m.outputs.append(attempt.output_dir)
        say(
            f"  {rate:,.0f} events/s steady, {rec.wall_s:.1f}s wall, "
            f"peak RSS {rec.peak_rss_kb / 1024:.0f} MB, recount: {verdict.summary}"
        )
    summarize_repeats(res, workload.events, rates, walls, rss)
    # checkpoint figures and series from the median repeat
    order = sorted(range(len(rates)), key=rates.__getitem__)
    mid_attempt, mid_win = attempts[order[len(order) // 2]]
    res.config = {**mid_attempt.config, "workload": workload.describe(), "repeats": repeats}
    res.config["background_cores_before_runs"] = backgrounds
    res.config["cpu_s"] = cpus  # per repeat: the tree's user+sys, main and child processes
    if parallel_readers:  # per repeat, for comparison: the window of the summed positions
        res.config["steady_summed_events_per_s"] = summed
        res.config["steady_windows"] = windows  # (seconds, checkpoints completed inside)
    describe_median(res, mid_attempt, backgrounds)
    bpe = workload.bytes / workload.events
    res.series = {
        "progress": [(round(t, 3), round(v / bpe)) for t, v in mid_attempt.record.positions],
        "checkpoints": [(round(t, 3), cid, ms) for t, cid, ms, _ in mid_attempt.completed],
        "checkpoint_ms_all": [ms for a, _ in attempts for _, _, ms, _ in a.completed],
        "steady": [mid_win.t_start, mid_win.t_end] if mid_win else None,
        "bucket_rates": [r / bpe for r in mid_win.bucket_rates] if mid_win else [],
    }
    verdicts = m.python_verdicts
    res.validator = "python"
    res.exactly_once_verified = all(v.passed for v in verdicts)
    res.validation = {
        "python": [v.to_json() for v in verdicts],
        "summary": "; ".join(sorted({v.summary for v in verdicts})),
    }
    return m


def window_checkpoints(
    win: SteadyWindow | None, completed: list[tuple[float, int, float, int]]
) -> tuple[float, int] | None:
    """The window's length and how many checkpoints completed inside it.

    A window shorter than a few checkpoint intervals holds none or one of the
    pauses that checkpoints cost, by chance: its rate is then not the job's.
    """
    if win is None:
        return None
    inside = sum(1 for t, *_ in completed if win.t_start <= t <= win.t_end)
    return round(win.t_end - win.t_start, 2), inside


def python_recount_multi(
    workload: Workload, attempt: Attempt, expected: dict[str, int] | None
) -> Verdict:
    from aiostream_ckpt.connectors.staging import read_committed_output
    from bench.validation import check_pv_records, expected_counts

    exp = expected
    if exp is None:
        exp = {}
        for p in workload.paths:
            for k, n in expected_counts(p).items():
                exp[k] = exp.get(k, 0) + n
    return check_pv_records(read_committed_output(attempt.output_dir), exp)


def validate_with_spark(
    measured: list[Measured], jobs: list[dict[str, str]], what: str, fallback: str
) -> None:
    """Run the Spark validator over ``jobs`` in one session and fold its verdicts in."""
    say(f"Spark validation of {len(jobs)} {what} (one session) ...")
    verdicts, err = spark_validate(jobs)
    if err:
        say(f"Spark validator unavailable: {err}; the {fallback} stands")
    attach_spark(measured, verdicts.get, err)


def attach_spark(
    measured: list[Measured], verdict_for: Callable[[str], Verdict | None], spark_error: str | None
) -> None:
    """Fold Spark verdicts in: the run passes only if Spark and the recount both pass."""
    for m in measured:
        r = m.result
        if r.status != "ok" or not m.outputs:
            continue
        sv = [verdict_for(f"{id(m)}-{i}") for i in range(len(m.outputs))]
        if any(v is None or v.passed is None for v in sv):
            note = spark_error or next((v.summary for v in sv if v is not None), "no verdict")
            r.validation["spark_unavailable"] = note
            continue
        r.validator = "spark"
        r.validation["spark"] = [v.to_json() for v in sv if v is not None]
        spark_ok = all(v is not None and v.passed for v in sv)
        r.exactly_once_verified = bool(spark_ok and r.exactly_once_verified)
        if not spark_ok:
            r.validation["summary"] = "; ".join(
                sorted({v.summary for v in sv if v is not None and not v.passed})
            )
