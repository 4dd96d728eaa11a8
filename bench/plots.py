"""PNG plots, drawn by matplotlib in the bench-side `plot` venv (not a project dependency)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from bench.peers_env import BENCH_DIR, ensure_env


def plot_spec(doc: dict[str, Any], latencies_ms: list[float]) -> dict[str, Any]:
    runs = doc["runs"]
    compare = [r for r in runs if r["experiment"] == "compare"]
    return {
        "timeline": [
            {
                "system": f"{r['system']} ({r['path']})",
                "progress": r.get("series", {}).get("progress", []),
                "checkpoints": r.get("series", {}).get("checkpoints", []),
            }
            for r in compare
            if r.get("series")
        ],
        "checkpoint_ms": {
            f"{r['system']} {r['experiment']}": r["series"].get("checkpoint_ms_all", [])
            for r in runs
            if r.get("series", {}).get("checkpoint_ms_all")
        },
        "latency_ms": latencies_ms,
        "bars": [
            {"label": f"{r['system']}\n{r['path']}", "value": r["events_per_s"]}
            for r in compare
            if r.get("events_per_s")
        ],
        "scaling": [
            {"experiment": r["experiment"], "system": r["system"], "value": r["events_per_s"]}
            for r in runs
            if r["experiment"] != "compare" and r.get("events_per_s")
        ],
        "workers_scaling": [
            {
                "case": s["case"],
                "target": s["target_steady_ratio"],
                **{k: s.get(k) for k in ("steady_ratio", "wall_ratio", "cpu_bound_ratio")},
            }
            for s in doc.get("workers_scaling", [])
        ],
    }


def draw(doc: dict[str, Any], latencies_ms: list[float], out_dir: Path) -> list[Path] | str:
    """Write the PNGs into ``out_dir``; the paths, or why no plot was drawn."""
    return draw_spec(plot_spec(doc, latencies_ms), out_dir)


def draw_soak(soak: dict[str, Any], out_dir: Path) -> list[Path] | str:
    """Plot a soak's series (``bench.soak``): RSS, state, checkpoints, events/s over time."""
    return draw_spec({"soak": soak}, out_dir)


def draw_spec(spec: dict[str, Any], out_dir: Path) -> list[Path] | str:
    env = ensure_env("plot")
    if env.python is None:
        return f"no plots: {env.error}"
    out_dir.mkdir(parents=True, exist_ok=True)
    spec_path = out_dir / "plot-spec.json"
    spec_path.write_text(json.dumps(spec))
    r = subprocess.run(
        [str(env.python), str(BENCH_DIR / "peers" / "draw_plots.py"), str(spec_path), str(out_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        return f"plotting failed: {r.stderr.strip()[-400:]}"
    return [Path(p) for p in r.stdout.split()]
