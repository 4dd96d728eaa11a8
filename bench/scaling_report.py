"""How the workers scaling section reads in the bench's output: its line, its targets, its rows.

:mod:`bench.scaling` measures; this module renders a case's summary (the
dict of :func:`bench.scaling.summary`) for the progress lines, for the
note of its two rows in the results table, and for the one
line that says which of the issue's targets the run met.
"""

from __future__ import annotations

from typing import Any

#: fewer checkpoints than this inside a steady window: its rate holds their pauses by chance
MIN_WINDOW_CHECKPOINTS = 2


def target_met(ratio: float | None, target: float | None) -> bool | None:
    """Whether the steady ratio reaches its target; None when either is missing."""
    return None if ratio is None or target is None else ratio >= target


def verdict_word(met: bool | None) -> str:
    return {True: "met", False: "NOT met", None: "not measured"}[met]


def scaling_line(s: dict[str, Any]) -> str:
    """One case in full: rates, ratios, target, CPU per million events, verdict, load."""
    one, two = s["workers_1"], s["workers_2"]
    met = target_met(s["steady_ratio"], s["target_steady_ratio"])
    return (
        f"{s['case']}: steady {_num(one['events_per_s'])} -> {_num(two['events_per_s'])} "
        f"events/s = {_num(s['steady_ratio'], '.2f')}x (target {s['target_steady_ratio']}x: "
        f"{verdict_word(met)}){_summed(s)}, wall {_num(s['wall_ratio'], '.2f')}x, "
        f"CPU-bound {_num(s.get('cpu_bound_ratio'), '.2f')}x; "
        f"CPU s per M events {cpu_text(one['cpu_s_per_m_events'])}"
        f" -> {cpu_text(two['cpu_s_per_m_events'])}; exactly-once "
        f"{'yes' if s['exactly_once'] else 'NO/unchecked'}{_validators(s)}; "
        f"load {s['load_avg'][0]}"
    )


def section_text(summaries: list[dict[str, Any]]) -> str:
    """What the bench prints under its table: one line per case, then the targets' verdict."""
    return "\n".join([*map(scaling_line, summaries), targets_line(summaries)])


def targets_line(summaries: list[dict[str, Any]]) -> str:
    """The section's verdict: each case's steady ratio against its target, and the count met."""
    parts = []
    met_n = 0
    for s in summaries:
        met = target_met(s["steady_ratio"], s["target_steady_ratio"])
        met_n += met is True
        sign = {True: ">=", False: "<", None: "vs"}[met]
        eo = "" if s["exactly_once"] else ", exactly-once NOT verified"
        parts.append(
            f"{s['case']} {_num(s['steady_ratio'], '.2f')}x {sign} "
            f"{s['target_steady_ratio']}x {verdict_word(met)}{eo}"
        )
    return (
        f"workers scaling targets (steady rate, workers=2 / workers=1): {'; '.join(parts)} "
        f"-- {met_n} of {len(summaries)} met"
    )


def row_note(sc: dict[str, Any]) -> str:
    """The results table's note for a workers row (``config["workers_scaling"]``).

    The workers=2 row carries the case's ratio, target and verdict; both rows
    their CPU seconds per million events (main + each worker at workers=2).
    """
    cpu = cpu_text(sc.get("cpu_s_per_m_events") or {}, short=True)
    if sc.get("workers") == 1:
        return f"CPU s/M ev {cpu}"
    met = target_met(sc.get("steady_ratio"), sc.get("target_steady_ratio"))
    return (
        f"{_num(sc.get('steady_ratio'), '.2f')}x w=1, target {sc.get('target_steady_ratio')}x "
        f"{verdict_word(met)}; CPU-bound {_num(sc.get('cpu_bound_ratio'), '.2f')}x; "
        f"CPU s/M ev {cpu}"
    )


def cpu_text(c: dict[str, Any], *, short: bool = False) -> str:
    """``total (main m, w0 a, w1 b)``; short: ``total = m+a+b``."""
    if not c:
        return "-"
    if short:
        procs = [c["main"], *c.get("workers", [])]
        return f"{c['total']:.2f}" + (
            " = " + "+".join(f"{x:.2f}" for x in procs) if len(procs) > 1 else ""
        )
    parts = [f"main {c['main']:.2f}"] + [
        f"w{i} {x:.2f}" for i, x in enumerate(c.get("workers", []))
    ]
    return f"{c['total']:.2f} ({', '.join(parts)})"


def _validators(s: dict[str, Any]) -> str:
    names = s.get("validators") or []
    return f" ({'+'.join(names)})" if names else ""


def _summed(s: dict[str, Any]) -> str:
    """The summed positions' ratio and the windows (seconds/checkpoints inside)."""
    if s.get("steady_summed_ratio") is None:
        return ""

    def windows(w: dict[str, Any]) -> str:
        return " ".join(f"{x[0]:g}s/{x[1]}" for x in w.get("steady_windows") or [] if x)

    wins = [x for w in (s["workers_1"], s["workers_2"]) for x in w.get("steady_windows") or []]
    short = any(x is None or x[1] < MIN_WINDOW_CHECKPOINTS for x in wins)
    return (
        f" [summed positions {_num(s['steady_summed_ratio'], '.2f')}x; windows "
        f"{windows(s['workers_1'])} -> {windows(s['workers_2'])}"
        f"{'; SHORT windows: not a rate to quote, give more --events' if short else ''}]"
    )


def _num(v: Any, spec: str = ",.0f") -> str:
    return "-" if v is None else format(v, spec)
