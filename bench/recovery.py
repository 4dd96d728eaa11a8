"""Recovery time of ours under kill -9, through the project's chaos harness.

``run_with_kills`` SIGKILLs the worker at random points of its input once a
checkpoint has completed (by input position, not time: a time-based kill can
come after a fast run ended, as 1 M events at ~1 M events/s did) and starts it
again on the same checkpoint directory. Beside it a
watcher follows the live worker (found by its unique checkpoint directory on
the command line) and samples its input read position, so for every kill we
get: kill → first checkpoint completed after the restart (its transactions
commit then: the first committed output), and kill → the restarted worker has
read past where the killed one was (caught up).
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiostream_ckpt_dev.chaos.kills import run_with_kills
from bench.monitor import _Progress
from bench.stats import median
from bench.systems import Ours, RunSpec, ours_env_cwd

_COMPLETED = re.compile(r"checkpoint (\d+) completed")


def _find_worker(marker: str) -> int | None:
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    return int(name)
        except OSError:
            continue
    return None


@dataclass
class _Watch:
    marker: str
    paths: tuple[Path, ...]
    t0: float
    #: (t, pid, bytes read)
    samples: list[tuple[float, int, float]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        pid, progress = None, None
        while not self.stop.is_set():
            if pid is None or not os.path.exists(f"/proc/{pid}"):
                pid = _find_worker(self.marker)
                progress = _Progress(self.paths) if pid else None
            if pid is not None and progress is not None:
                pos = progress.sample(pid)
                if pos is not None:
                    self.samples.append((time.monotonic() - self.t0, pid, pos))
            time.sleep(0.02)


def measure_recovery(spec: RunSpec, *, kills: int, seed: int = 7) -> dict[str, Any]:
    ours = Ours()
    ckpt = spec.run_dir / "ckpt"
    cmd = ours.command(spec, ckpt)
    watch = _Watch(str(ckpt), spec.workload.paths, time.monotonic())
    lines: list[tuple[float, str]] = []
    thread = threading.Thread(target=watch.run, daemon=True)
    thread.start()
    env, cwd = ours_env_cwd()
    t_start = time.monotonic()
    try:
        result = run_with_kills(
            cmd,
            kills=kills,
            seed=seed,
            max_delay_after_checkpoint=1.0,
            timeout=spec.timeout,
            log_path=spec.run_dir / "chaos.log",
            cwd=cwd,
            env=env,
            on_line=lambda ln: lines.append((time.monotonic() - watch.t0, ln)),
            inputs=spec.workload.paths,
        )
    finally:
        watch.stop.set()
        thread.join(timeout=5)
    offset = t_start - watch.t0
    kill_times = [k + offset for k in result.kill_times]
    completed = [t for t, ln in lines if _COMPLETED.search(ln)]
    per_kill = []
    for tk in kill_times:
        before = [s for s in watch.samples if s[0] <= tk]
        pos_at_kill = before[-1][2] if before else None
        killed_pid = before[-1][1] if before else None
        first_commit = next((t - tk for t in completed if t > tk), None)
        caught = None
        if pos_at_kill is not None:
            caught = next(
                (
                    t - tk
                    for t, pid, pos in watch.samples
                    if t > tk and pid != killed_pid and pos >= pos_at_kill
                ),
                None,
            )
        per_kill.append(
            {"kill_at_s": round(tk, 3), "first_commit_s": first_commit, "caught_up_s": caught}
        )
    firsts = [k["first_commit_s"] for k in per_kill if k["first_commit_s"] is not None]
    caughts = [k["caught_up_s"] for k in per_kill if k["caught_up_s"] is not None]
    return {
        "exit_code": result.exit_code,
        "kills": result.kills,
        "runs": result.runs,
        "elapsed_s": round(result.elapsed, 3),
        "per_kill": per_kill,
        "first_commit_s": median(firsts),
        "caught_up_s": median(caughts),
        "output_dir": str(spec.out_dir),
        "definition": "kill -9 -> first checkpoint completed after restart (its output commits); "
        "kill -> restarted worker has read past the killed worker's input position",
    }
