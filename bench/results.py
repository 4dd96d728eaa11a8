"""Run results, the JSON document, ratios to ours, the refusal rule and the printed table.

The refusal rule: a run whose output was checked and found not exactly-once
keeps its diagnostics but loses its figures (they are moved under
``withheld``), so no number from a wrong run can be quoted by mistake.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
from dataclasses import dataclass, field
from typing import Any

from bench.scaling_report import row_note
from bench.stats import ratio

SYSTEMS = (
    "aiostream-ckpt",
    "bare-loop",
    "bare-aiokafka",
    "bytewax",
    "quixstreams",
    "faust",
    "pyflink",
)
OURS = "aiostream-ckpt"
PATHS = ("embedded", "kafka")
#: Figures compared with ours: higher-is-better or not, it is a plain ratio value / ours.
RATIO_FIELDS = (
    "events_per_s",
    "events_per_s_wall",
    "peak_rss_mb",
    "checkpoint_ms_p50",
    "checkpoint_ms_p99",
    "latency_ms_p50",
    "latency_ms_p99",
    "recovery_first_commit_s",
    "recovery_caught_up_s",
)
#: Figures withheld from a refused run.
FIGURE_FIELDS = (*RATIO_FIELDS, "events_per_s_spread", "events_per_s_repeats", "wall_s")


class SchemaError(ValueError):
    """A results document does not have the documented shape."""


@dataclass
class RunResult:
    """One system on one path in one experiment (figures are medians over repeats)."""

    system: str
    path: str
    experiment: str = "compare"
    #: "ok", "refused" (not exactly-once), "failed" (crashed), "unavailable" (cannot run here)
    status: str = "ok"
    reason: str | None = None
    events: int | None = None
    events_per_s: float | None = None
    events_per_s_wall: float | None = None
    events_per_s_spread: dict[str, Any] | None = None
    events_per_s_repeats: list[float] = field(default_factory=list)
    wall_s: float | None = None
    peak_rss_mb: float | None = None
    exactly_once_verified: bool | None = None
    validator: str | None = None
    validation: dict[str, Any] = field(default_factory=dict)
    checkpoint_ms_p50: float | None = None
    checkpoint_ms_p99: float | None = None
    checkpoint: dict[str, Any] | None = None
    latency_ms_p50: float | None = None
    latency_ms_p99: float | None = None
    latency: dict[str, Any] | None = None
    recovery_first_commit_s: float | None = None
    recovery_caught_up_s: float | None = None
    recovery: dict[str, Any] | None = None
    config: dict[str, Any] = field(default_factory=dict)
    fault_tolerance: str | None = None
    ratio_to_ours: dict[str, float | None] = field(default_factory=dict)
    withheld: dict[str, Any] | None = None
    #: time series for plots (not part of the ratio logic)
    series: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.system not in SYSTEMS:
            raise SchemaError(f"unknown system {self.system!r}; one of {', '.join(SYSTEMS)}")
        if self.path not in PATHS:
            raise SchemaError(f"unknown path {self.path!r}; embedded or kafka")

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "series" or v}


def unavailable(system: str, path: str, reason: str, **kw: Any) -> RunResult:
    return RunResult(system=system, path=path, status="unavailable", reason=reason, **kw)


def apply_refusal(run: RunResult) -> RunResult:
    """Withhold every figure of a run whose output was found not exactly-once.

    A run that could not be checked (``None``) keeps its figures; the table
    and JSON say ``exactly_once_verified: null`` so a reader knows.
    """
    if run.exactly_once_verified is not False or run.status == "refused":
        return run
    withheld = {}
    for name in FIGURE_FIELDS:
        value = getattr(run, name)
        if value not in (None, [], {}):
            withheld[name] = value
        setattr(run, name, [] if name == "events_per_s_repeats" else None)
    run.withheld = withheld
    run.status = "refused"
    detail = run.validation.get("summary") if run.validation else None
    run.reason = "output is not exactly-once" + (f": {detail}" if detail else "")
    return run


def compute_ratios(runs: list[RunResult]) -> None:
    """Fill ``ratio_to_ours`` of every run against ours in the same experiment and path.

    Where ours has no figure on that path, ratios are None rather than being
    taken against ours on another path.
    """
    ours = {(r.experiment, r.path): r for r in runs if r.system == OURS and r.status == "ok"}
    for r in runs:
        ref = ours.get((r.experiment, r.path))
        r.ratio_to_ours = {
            name: ratio(getattr(r, name), getattr(ref, name) if ref else None)
            for name in RATIO_FIELDS
        }


def machine_info() -> dict[str, Any]:
    mem_kb = 0
    try:
        with open("/proc/meminfo") as f:
            mem_kb = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def document(runs: list[RunResult], *, mode: str, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": mode,
        "machine": machine_info(),
        "params": params,
        "runs": [r.to_json() for r in runs],
    }


def validate_document(doc: dict[str, Any]) -> None:
    """Raise :class:`SchemaError` unless ``doc`` has the documented shape.

    Every run names a known system and path, has ``events_per_s`` (number or
    null) and ``exactly_once_verified`` (true, false or null); a refused run
    carries no throughput, and a run not verified exactly-once is never "ok"
    with a figure while the verdict is false.
    """
    runs = doc.get("runs")
    if not isinstance(runs, list):
        raise SchemaError("document has no 'runs' list")
    for i, r in enumerate(runs):
        if not isinstance(r, dict):
            raise SchemaError(f"runs[{i}] is not an object")
        if r.get("system") not in SYSTEMS:
            raise SchemaError(f"runs[{i}].system {r.get('system')!r} is not a known system")
        if r.get("path") not in PATHS:
            raise SchemaError(f"runs[{i}].path {r.get('path')!r} is not embedded or kafka")
        if "events_per_s" not in r or not (
            r["events_per_s"] is None or isinstance(r["events_per_s"], int | float)
        ):
            raise SchemaError(f"runs[{i}].events_per_s must be a number or null")
        if r.get("exactly_once_verified", "missing") not in (True, False, None):
            raise SchemaError(f"runs[{i}].exactly_once_verified must be true, false or null")
        if r["exactly_once_verified"] is False and r["events_per_s"] is not None:
            raise SchemaError(f"runs[{i}] reports throughput for output that is not exactly-once")


def _fmt(value: Any, spec: str = ",.0f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float | int):
        return format(value, spec)
    return str(value)


def table(runs: list[RunResult]) -> str:
    """A plain-text (and Markdown-compatible) table of the runs."""
    head = (
        "experiment",
        "system",
        "path",
        "events/s",
        "x ours",
        "spread",
        "ckpt p50/p99 ms",
        "peak RSS MB",
        "exactly-once",
        "note",
    )
    rows = [head]
    for r in runs:
        sp = r.events_per_s_spread
        ck = (
            f"{_fmt(r.checkpoint_ms_p50, '.0f')}/{_fmt(r.checkpoint_ms_p99, '.0f')}"
            if r.checkpoint_ms_p50 is not None
            else "-"
        )
        verdict = {True: "yes", False: "NO", None: "unchecked"}[r.exactly_once_verified]
        if r.validator and r.exactly_once_verified is not None:
            verdict += f" ({r.validator})"
        note = r.reason or ""
        if r.status == "ok" and r.recovery:
            note = (
                f"recovery: first commit {_fmt(r.recovery_first_commit_s, '.2f')} s, caught "
                f"up {_fmt(r.recovery_caught_up_s, '.2f')} s after kill -9 "
                f"({r.recovery.get('kills')} kills)"
            )
        if r.status == "ok" and r.latency:
            lat = r.latency.get("latency_ms") or {}
            note = (
                f"latency ms p50/p99/p99.9: {_fmt(lat.get('p50'), '.0f')}/"
                f"{_fmt(lat.get('p99'), '.0f')}/{_fmt(lat.get('p999'), '.0f')}"
            )
        win = r.config.get("windowed")
        if r.status == "ok" and win:
            # the target is judged on the steady tenths; the raw first/last beside it
            x = win.get("x_pv_count_paired")
            note = (
                (
                    f"{_fmt(x, '.2f')}x pv_count paired ({_fmt(win.get('x_pv_count'), '.2f')} "
                    "by medians)"
                    if x is not None
                    else f"{_fmt(win.get('x_pv_count'), '.2f')}x pv_count"
                )
                + "; last/first 10 %: "
                f"{_fmt(win.get('steady_last_vs_first'), '.2f')} steady, "
                f"{_fmt(win.get('last_vs_first'), '.2f')} raw"
            )
            if win.get("proof"):
                note += "; kill -9 proof " + ("PASS" if win["proof"]["passed"] else "FAIL")
        if r.status == "ok" and r.config.get("workers_scaling"):
            note = row_note(r.config["workers_scaling"])
        if r.status != "ok":
            note = f"{r.status.upper()}: {note}"
        rows.append(
            (
                r.experiment,
                r.system,
                r.path,
                _fmt(r.events_per_s),
                _fmt(r.ratio_to_ours.get("events_per_s"), ".2f"),
                f"±{sp['rel_spread'] * 100:.0f}% (n={sp['n']})" if sp else "-",
                ck,
                _fmt(r.peak_rss_mb, ".0f"),
                verdict,
                note[:90],
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    lines = [
        "| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
