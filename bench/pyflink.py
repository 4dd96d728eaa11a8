"""PyFlink (apache-flink) peer on the embedded path: parallelism 1, checkpoints on, thread mode.

The job (``bench/peers/pyflink_pv_count.py``) runs in a local mini-cluster in a
JVM the PyFlink client starts; Flink's own log goes to ``<run>/flink-log``
(``FLINK_LOG_DIR``), not into the installed package's ``log/`` directory.
"""

from __future__ import annotations

import os
import re
import time
from datetime import datetime
from pathlib import Path

from bench.monitor import run_monitored
from bench.systems import PEERS_DIR, SINGLE_OUTPUT, Attempt, RunSpec, _PeerSystem


class PyFlink(_PeerSystem):
    name = "pyflink"
    env_name = "pyflink"
    dist = "apache-flink"

    def run(self, spec: RunSpec) -> Attempt:
        env = self.env()
        assert env.python is not None
        flink_out = spec.run_dir / "flink-out"
        interval = spec.interval_s if spec.interval_s > 0 else 1.0
        run_env = {
            **os.environ,
            "BENCH_INPUT": str(spec.workload.paths[0]),
            "BENCH_OUTPUT": str(flink_out),
            "BENCH_CKPT": str(spec.run_dir / "ckpt"),
            "BENCH_INTERVAL_MS": str(int(interval * 1000)),
            "FLINK_LOG_DIR": str(spec.run_dir / "flink-log"),
        }
        cmd = [str(env.python), str(PEERS_DIR / "pyflink_pv_count.py")]
        started = time.time()
        rec = run_monitored(
            cmd,
            input_paths=spec.workload.paths,
            env=run_env,
            timeout=spec.timeout,
            log_path=spec.run_dir / "worker.log",
        )
        spec.out_dir.mkdir(parents=True, exist_ok=True)
        _concat_parts(flink_out, spec.out_dir / SINGLE_OUTPUT)
        flink_log = _flink_log_lines(spec.run_dir / "flink-log")
        if rec.exit_code != 0 or rec.timed_out:
            # The JVM logs to its file, not to stderr: put its failures where the bench looks.
            rec.lines += [(rec.wall_s, ln) for ln in _failure_lines(flink_log)]
        attempt = Attempt(
            rec,
            spec.out_dir,
            {
                "parallelism": 1,
                "checkpoint_interval_s": interval,
                "python.execution-mode": "thread",
                "python.state.cache-size": 100000,
                "python.fn-execution.bundle.size": 10000,
                "python.executable": "the peer venv's python (also python.client.executable)",
                "state.backend.type": "hashmap",
            },
            f"exactly-once checkpoints every {interval:g}s (hashmap state), FileSink "
            "(part file rolled on every checkpoint, committed when it completes)",
        )
        attempt.completed = _completed_checkpoints(flink_log, started)
        return attempt


_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_FLINK_COMPLETED = re.compile(
    r"Completed checkpoint (\d+) for job \S+ \((\d+) bytes, checkpointDuration=(\d+) ms"
)


def _flink_log_lines(log_dir: Path) -> list[str]:
    lines: list[str] = []
    for p in sorted(log_dir.glob("*.log")):
        lines += p.read_text(errors="replace").splitlines()
    return lines


def _completed_checkpoints(lines: list[str], started: float) -> list[tuple[float, int, float, int]]:
    """Flink's ``Completed checkpoint N ... (B bytes, checkpointDuration=X ms`` log lines
    as (seconds since the worker started, id, ms, bytes), like ours' log lines.

    >>> line = ("2026-11-22 10:40:17,654 INFO  x [] - Completed checkpoint 1 for job ab "
    ...         "(5564 bytes, checkpointDuration=133 ms, finalizationTime=14 ms).")
    >>> t0 = datetime(2026, 11, 22, 10, 40, 16, 654000).timestamp()
    >>> _completed_checkpoints([line], t0)
    [(1.0, 1, 133.0, 5564)]
    """
    out = []
    for ln in lines:
        m = _FLINK_COMPLETED.search(ln)
        t = _LOG_TIME.match(ln)
        if m and t:
            at = datetime.strptime(t.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append(
                (round(at - started, 3), int(m.group(1)), float(m.group(3)), int(m.group(2)))
            )
    return out


def _failure_lines(lines: list[str], n: int = 3) -> list[str]:
    """The last few failure causes in Flink's log (``Caused by:`` lines, else WARN/ERROR)."""
    causes = [ln.strip() for ln in lines if ln.startswith("Caused by:")]
    if not causes:
        causes = [ln.strip() for ln in lines if " ERROR " in ln or "to FAILED" in ln]
    unique = list(dict.fromkeys(reversed(causes)))[:n]
    return [f"flink log: {c}" for c in reversed(unique)]


_PART = re.compile(r"^part-.*-(\d+)\.jsonl$")


def _concat_parts(src: Path, dest: Path) -> None:
    """Flink's committed part files, in commit order, into one file.

    Committed files are ``part-<uuid>-<counter>.jsonl`` (in-progress and pending
    ones start with a dot); the counter grows by one per rolled file, so it
    orders them (by number: ``-10`` comes after ``-9``).
    """
    parts = []
    if src.is_dir():
        for p in src.rglob("*"):
            m = _PART.match(p.name)
            if m and p.is_file():
                parts.append((str(p.parent), int(m.group(1)), p))
    parts.sort()
    with open(dest, "wb") as out:
        for *_, p in parts:
            out.write(p.read_bytes())
