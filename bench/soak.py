"""``python -m bench --soak MINUTES``: does ours stay flat under a steady load?

Runs pv_count and the tumbling-window count (``apps/window_count.py``) side by
side, each on generated input paced at a steady rate (``app.rate``), with
1 s checkpoints, and samples every few seconds from outside the workers: RSS
of each worker's process tree, bytes on disk of its working state
(``state.local_dir``) and of its checkpoint directory, its open file
descriptors and the files in both directories, and its events read (the
source task's ``records_in`` from the REST API). After the warm-up each series
gets a least-squares slope, reported as growth in % of its mean per 10 minutes;
the target is under 1 % for every series. Each worker's CPU (its process
tree's user + system seconds per wall second, in % of a core) is sampled too
and reported with its slope, not judged: at a steady paced load it should be
small and flat (a spinning event loop or a per-record cost that grows with
history shows there first). A leak shows as a positive slope
however noisy the samples are; a sawtooth (checkpoint chains: a full snapshot
every 10, two retained) averages out only over many periods, so each series'
peak in the later half after the warm-up is also compared with its peak in
the earlier half (``bounded``: no resource's later peak above the earlier +1 %).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.monitor import _rss_kb, _stat_cpu, process_tree
from bench.runner import say
from bench.systems import ours_env_cwd

#: Seconds between samples.
SAMPLE_S = 5.0
#: Growth per 10 minutes (% of the mean) a flat series stays under.
TARGET_PCT_PER_10MIN = 1.0

APPS = {
    "pv_count": ("apps.pv_count", []),
    "tumbling windows": ("apps.window_count", ["app.window=tumbling", "app.size=10000"]),
}


@dataclass
class Worker:
    """One soaked app: its process, directories and samples."""

    name: str
    proc: subprocess.Popen[bytes]
    run_dir: Path
    #: (minutes since start, rss MB, working state MB, checkpoint dir MB, events read)
    samples: list[tuple[float, float, float, float, int]] = field(default_factory=list)
    #: (minutes since start, open fds of the process tree, files in checkpoint dir, in state dir)
    counts: list[tuple[float, int, int, int]] = field(default_factory=list)
    #: (minutes since start, CPU seconds of the process tree so far)
    cpu: list[tuple[float, float]] = field(default_factory=list)
    url: str | None = None

    @property
    def state_dir(self) -> Path:
        return self.run_dir / "state"

    @property
    def ckpt_dir(self) -> Path:
        return self.run_dir / "ckpt"


def disk_mb(root: Path) -> float:
    """Bytes on disk (allocated blocks, so sparse files count what they use) under ``root``."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            with contextlib.suppress(OSError):  # removed meanwhile (retention)
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total / 1e6


def file_count(root: Path) -> int:
    """Files under ``root`` (a leak of files shows here before it shows in bytes)."""
    return sum(len(files) for _dirpath, _dirs, files in os.walk(root))


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds ``pids`` have used (0 for a process that is gone)."""
    total = 0.0
    for pid in pids:
        own = _stat_cpu(pid)
        if own is not None:
            total += own[0]
    return total


def cpu_pct(cpu: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """% of a core used between consecutive samples, at the midpoint (minutes)."""
    out = []
    for (t0, c0), (t1, c1) in itertools.pairwise(cpu):
        if t1 > t0:
            out.append(((t0 + t1) / 2, round(100 * (c1 - c0) / ((t1 - t0) * 60), 3)))
    return out


def fd_count(pids: list[int]) -> int:
    """Open file descriptors of ``pids`` (0 for a process that is gone)."""
    n = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            n += len(os.listdir(f"/proc/{pid}/fd"))
    return n


def _events_read(w: Worker) -> int | None:
    if w.url is None:
        try:
            info = json.loads((w.ckpt_dir / "daemon.json").read_text())
            w.url = f"http://{info['host']}:{info['port']}"
        except (OSError, ValueError, KeyError):
            return None
    try:
        with urllib.request.urlopen(w.url + "/operators", timeout=2) as r:
            tasks = json.loads(r.read())["tasks"]
    except (OSError, ValueError, KeyError):
        return None
    return sum(int(t["records_in"]) for t in tasks if "events" in t["operators"])


def _start(name: str, rate: float, minutes: float, keys: int, work: Path) -> Worker:
    app, sets = APPS[name]
    run_dir = work / name.replace(" ", "-")
    run_dir.mkdir(parents=True, exist_ok=True)
    events = int(rate * (minutes * 60 + 120))  # outlasts the soak: it is stopped, not ended
    sets = [
        f"app.generate={events}",
        f"app.rate={rate}",
        f"app.keys={keys}",
        f"app.output={run_dir / 'out'}",
        f"checkpoint.dir={run_dir / 'ckpt'}",
        "checkpoint.interval=1.0",
        f"state.local_dir={run_dir / 'state'}",
        "rest.port=0",
        *sets,
    ]
    (run_dir / "state").mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "aiostream_ckpt.daemon.cli", "run", app]
    for s in sets:
        cmd += ["--set", s]
    env, cwd = ours_env_cwd()
    log = open(run_dir / "worker.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    log.close()
    return Worker(name, proc, run_dir)


def slope_pct_per_10min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(minutes, value)`` as % of the mean value per 10 minutes."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    sxx = sum((t - mx) ** 2 for t, _ in points)
    if sxx == 0 or my == 0:
        return None
    slope = sum((t - mx) * (v - my) for t, v in points) / sxx
    return round(100 * slope * 10 / my, 3)


def is_flat(slopes: dict[str, float | None]) -> bool:
    """No resource grows and the throughput does not fall, by more than the target.

    A resource that shrinks after the warm-up (a checkpoint chain compacted) is bounded, not a
    leak; the throughput is judged the other way round.
    """
    for name, s in slopes.items():
        if s is None:
            return False
        if (-s if name == "events_per_s" else s) >= TARGET_PCT_PER_10MIN:
            return False
    return True


def rates(samples: list[tuple[float, float, float, float, int]]) -> list[tuple[float, float]]:
    """Events/s between consecutive samples, at the midpoint (minutes)."""
    out = []
    for a, b in itertools.pairwise(samples):
        dt = (b[0] - a[0]) * 60
        if dt > 0:
            out.append(((a[0] + b[0]) / 2, (b[4] - a[4]) / dt))
    return out


def summarize(w: Worker, warmup_min: float) -> dict[str, Any]:
    """Slopes after the warm-up, and the series."""
    after = [s for s in w.samples if s[0] >= warmup_min]
    rate_pts = [p for p in rates(w.samples) if p[0] >= warmup_min]
    series = {
        "rss_mb": [(t, r) for t, r, _, _, _ in after],
        "working_state_mb": [(t, s) for t, _, s, _, _ in after],
        "checkpoint_dir_mb": [(t, c) for t, _, _, c, _ in after],
        "events_per_s": rate_pts,
    }
    slopes = {k: slope_pct_per_10min(v) for k, v in series.items()}
    cpu = [p for p in cpu_pct(w.cpu) if p[0] >= warmup_min]
    # a sawtooth (checkpoint chains) is judged by its peaks: the later half's against the earlier
    peaks = {k: [_peak(p[: len(p) // 2]), _peak(p[len(p) // 2 :])] for k, p in series.items()}
    means = {k: round(sum(v for _, v in p) / len(p), 3) if p else None for k, p in series.items()}
    flat = is_flat(slopes)
    grown = [k for k, (a, b) in peaks.items() if k != "events_per_s" and b > a * 1.01]
    counted = [c for c in w.counts if c[0] >= warmup_min]
    half = len(counted) // 2
    # min / max of each count in the earlier and the later half after the warm-up
    counts = {
        name: [
            [min((c[i] for c in part), default=0), max((c[i] for c in part), default=0)]
            for part in (counted[:half], counted[half:])
        ]
        for i, name in ((1, "fds"), (2, "checkpoint_files"), (3, "state_files"))
    }
    return {
        "app": w.name,
        "exit_code": w.proc.returncode,
        "samples": len(w.samples),
        "warmup_min": warmup_min,
        "mean_after_warmup": means,
        "slope_pct_per_10min": slopes,
        "max_first_second_half": peaks,
        "flat": flat,
        #: % of a core after the warm-up (mean, slope in % of the mean per 10 min): reported
        "cpu_pct": {
            "mean": round(sum(v for _, v in cpu) / len(cpu), 2) if cpu else None,
            "slope_pct_per_10min": slope_pct_per_10min(cpu),
        },
        #: no resource's peak in the later half above its earlier peak (+1 %)
        "bounded": not grown,
        #: [[min, max] earlier half, [min, max] later half] of fds and file counts
        "counts_first_second_half": counts,
        "series": {
            "rss_mb": [(t, r) for t, r, _, _, _ in w.samples],
            "working_state_mb": [(t, s) for t, _, s, _, _ in w.samples],
            "checkpoint_dir_mb": [(t, c) for t, _, _, c, _ in w.samples],
            "events_per_s": rates(w.samples),
            "cpu_pct": cpu_pct(w.cpu),
        },
    }


def _peak(points: list[tuple[float, float]]) -> float:
    return round(max((v for _, v in points), default=0.0), 3)


def run_soak(
    minutes: float,
    work: Path,
    *,
    rate: float,
    keys: int,
    warmup_min: float | None = None,
) -> dict[str, Any]:
    """Soak both apps for ``minutes`` at ``rate`` events/s each; return the document."""
    warmup = warmup_min if warmup_min is not None else min(5.0, minutes / 4)
    work.mkdir(parents=True, exist_ok=True)
    say(
        f"soak: pv_count and tumbling windows, {rate:,.0f} events/s each, {keys:,} keys, "
        f"{minutes:g} min (slopes after {warmup:g} min)"
    )
    workers = [_start(name, rate, minutes, keys, work) for name in APPS]
    t0 = time.monotonic()
    try:
        while (now := (time.monotonic() - t0) / 60) < minutes:
            for w in workers:
                if w.proc.poll() is not None:
                    raise RuntimeError(
                        f"soak: {w.name} exited early ({w.proc.returncode}); "
                        f"see {w.run_dir / 'worker.log'}"
                    )
                n = _events_read(w)
                if n is None:
                    continue  # not serving yet
                at = round(
                    (time.monotonic() - t0) / 60, 4
                )  # when the count came: a busy worker is late
                tree = process_tree(w.proc.pid)
                rss = sum(_rss_kb(p)[0] for p in tree) / 1024
                w.samples.append((at, rss, disk_mb(w.state_dir), disk_mb(w.ckpt_dir), n))
                w.counts.append(
                    (at, fd_count(tree), file_count(w.ckpt_dir), file_count(w.state_dir))
                )
                w.cpu.append((at, cpu_seconds(tree)))
            if int(now * 60 / SAMPLE_S) % 12 == 0 and workers[0].samples:
                say("  " + "; ".join(_line(w) for w in workers if w.samples))
            time.sleep(SAMPLE_S)
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
    return {
        "minutes": minutes,
        "rate_per_app": rate,
        "keys": keys,
        "sample_s": SAMPLE_S,
        "target_pct_per_10min": TARGET_PCT_PER_10MIN,
        "apps": [summarize(w, warmup) for w in workers],
    }


def _line(w: Worker) -> str:
    t, rss, state, ckpt, n = w.samples[-1]
    return (
        f"{w.name} {t:.1f} min: {n:,} events, RSS {rss:.0f} MB, "
        f"state {state:.1f} MB, ckpt {ckpt:.1f} MB"
    )


def table(doc: dict[str, Any]) -> str:
    """Slopes per app and series, in % of the mean per 10 minutes."""
    names = ("rss_mb", "working_state_mb", "checkpoint_dir_mb", "events_per_s")
    rows = [("app", *(f"{n}: slope (mean; max 1st/2nd half)" for n in names), "flat", "bounded")]
    for a in doc["apps"]:
        cells = []
        for n in names:
            s, m = a["slope_pct_per_10min"][n], a["mean_after_warmup"][n]
            h1, h2 = a["max_first_second_half"][n]
            slope = "-" if s is None else f"{s:+.2f}"
            mean = "-" if m is None else f"{m:.4g}"
            cells.append(f"{slope} %/10min ({mean}; {h1:.4g}/{h2:.4g})")
        rows.append(
            (a["app"], *cells, "yes" if a["flat"] else "NO", "yes" if a["bounded"] else "NO")
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    for a in doc["apps"]:
        cpu = a.get("cpu_pct") or {}
        if cpu.get("mean") is not None:
            slope = cpu["slope_pct_per_10min"]
            lines.append(
                f"{a['app']} CPU after warm-up: {cpu['mean']:.1f} % of a core"
                + ("" if slope is None else f" (slope {slope:+.2f} %/10min)")
            )
        counts = a.get("counts_first_second_half", {})
        lines.append(
            f"{a['app']} counts, earlier / later half: "
            + ", ".join(
                f"{name} {e[0]}-{e[1]} / {later[0]}-{later[1]}"
                for name, (e, later) in counts.items()
            )
        )
    return "\n".join(lines)
