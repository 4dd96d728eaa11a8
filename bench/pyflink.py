"""PyFlink (apache-flink) peer on the embedded path: parallelism 1, checkpoints on, thread mode."""

from __future__ import annotations

import os
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
        }
        cmd = [str(env.python), str(PEERS_DIR / "pyflink_pv_count.py")]
        rec = run_monitored(
            cmd,
            input_paths=spec.workload.paths,
            env=run_env,
            timeout=spec.timeout,
            log_path=spec.run_dir / "worker.log",
        )
        spec.out_dir.mkdir(parents=True, exist_ok=True)
        _concat_parts(flink_out, spec.out_dir / SINGLE_OUTPUT)
        return Attempt(
            rec,
            spec.out_dir,
            {
                "parallelism": 1,
                "checkpoint_interval_s": interval,
                "python.execution-mode": "thread",
                "python.state.cache-size": 100000,
                "python.fn-execution.bundle.size": 10000,
            },
            f"exactly-once checkpoints every {interval:g}s (hashmap state), FileSink "
            "(part files committed on checkpoint)",
        )


def _concat_parts(src: Path, dest: Path) -> None:
    """Flink's committed part files (no leading dot), in name order, into one file."""
    parts = sorted(p for p in src.rglob("*") if p.is_file() and not p.name.startswith("."))
    with open(dest, "wb") as out:
        for p in parts:
            out.write(p.read_bytes())
