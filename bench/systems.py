"""The systems under test on the embedded path: how each is started on a workload.

Every system reads the same JSONL input and writes pv_count lines
(``{"app_id": ..., "pv": n}``) into ``<run>/out`` under the file sink's
committed naming, so one validator reads them all.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.monitor import ProcessRecord, run_monitored
from bench.peers_env import BENCH_DIR, PeerEnv, ensure_env, version_of

REPO = BENCH_DIR.parent
PEERS_DIR = BENCH_DIR / "peers"
#: The committed-file name the validator reads, for single-file outputs.
SINGLE_OUTPUT = "part-0000000000-0000.jsonl"
_COMPLETED = re.compile(r"checkpoint (\d+) completed in (\d+(?:\.\d+)?) ms \((\d+) bytes\)")


@dataclass(frozen=True)
class Workload:
    """The input: JSONL files of seeded page views, and how they were made."""

    paths: tuple[Path, ...]
    events: int
    keys: int
    seed: int
    skew: float
    event_size: int

    @property
    def bytes(self) -> int:
        return sum(p.stat().st_size for p in self.paths)

    def describe(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "keys": self.keys,
            "seed": self.seed,
            "skew": self.skew,
            "event_size": self.event_size,
            "input_bytes": self.bytes,
            "files": len(self.paths),
        }


@dataclass
class RunSpec:
    workload: Workload
    run_dir: Path
    parallelism: int = 1
    #: checkpoint / snapshot interval in seconds; 0 switches fault tolerance off where allowed
    interval_s: float = 1.0
    mode: str = "exactly_once"
    full_every: int | None = None
    app: str = "apps.pv_count"
    sets: list[str] = field(default_factory=list)
    timeout: float = 600.0

    @property
    def out_dir(self) -> Path:
        return self.run_dir / "out"


@dataclass
class Attempt:
    """One run of one system: the watched process and what it left behind."""

    record: ProcessRecord
    output_dir: Path
    config: dict[str, Any]
    fault_tolerance: str
    #: parsed ``_metadata`` of every checkpoint seen while it ran, by id
    checkpoints: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: (seconds since start, checkpoint id, duration ms, bytes) from the log
    completed: list[tuple[float, int, float, int]] = field(default_factory=list)


class System(ABC):
    name = ""
    path = "embedded"

    def unavailable_reason(self) -> str | None:
        return None

    def version(self) -> str | None:
        return None

    @abstractmethod
    def run(self, spec: RunSpec) -> Attempt:
        """Run the system once on ``spec`` and report what was measured."""


class _CheckpointPoller:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.seen: dict[int, dict[str, Any]] = {}

    def __call__(self, _now: float) -> None:
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            if not name.startswith("chk-"):
                continue
            cid = int(name[4:])
            if cid in self.seen:
                continue
            meta = self.directory / name / "_metadata"
            try:
                from aiostream_ckpt.checkpoint.metadata import decode_metadata

                self.seen[cid] = decode_metadata(meta.read_bytes(), meta)
            except (OSError, ValueError, Exception):
                continue


def completed_from_lines(lines: list[tuple[float, str]]) -> list[tuple[float, int, float, int]]:
    """``checkpoint N completed in X ms (B bytes)`` log lines as (t, id, ms, bytes).

    >>> completed_from_lines([(1.5, "... checkpoint 3 completed in 79 ms (26109 bytes)")])
    [(1.5, 3, 79.0, 26109)]
    """
    out = []
    for t, line in lines:
        m = _COMPLETED.search(line)
        if m:
            out.append((t, int(m.group(1)), float(m.group(2)), int(m.group(3))))
    return out


#: Where ours is imported from: None for the repo's working tree (the editable install),
#: else a directory holding ``aiostream_ckpt/`` and ``apps/`` (see ``--engine-rev``).
ENGINE_SRC: list[Path | None] = [None]


def ours_env_cwd() -> tuple[dict[str, str], Path]:
    """Environment and working directory that make the worker import the chosen engine tree."""
    src = ENGINE_SRC[0]
    if src is None:
        return dict(os.environ), REPO
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH")) if p)
    return env, src


def export_engine(rev: str, into: Path) -> Path:
    """``git archive REV aiostream_ckpt apps`` into ``into/engine-REV`` (read-only on the repo)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    dest = into / f"engine-{sha}"
    if not (dest / "aiostream_ckpt").exists():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "archive", sha, "aiostream_ckpt", "apps"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


class Ours(System):
    """aiostream-ckpt through its CLI: ``aiostream-ckpt run APP --set ...``."""

    name = "aiostream-ckpt"

    def version(self) -> str | None:
        from importlib.metadata import version

        return version("aiostream-ckpt")

    def command(self, spec: RunSpec, ckpt_dir: Path) -> list[str]:
        sets = [
            f"app.input={','.join(str(p) for p in spec.workload.paths)}",
            f"app.output={spec.out_dir}",
            f"checkpoint.dir={ckpt_dir}",
            f"checkpoint.interval={spec.interval_s}",
            f"checkpoint.mode={spec.mode}",
            f"job.parallelism={spec.parallelism}",
        ]
        if spec.full_every is not None:
            sets.append(f"checkpoint.full_every={spec.full_every}")
        sets += spec.sets
        from aiostream_ckpt_dev.demo.kafka import worker_flags

        cmd = [sys.executable, "-m", "aiostream_ckpt.daemon.cli", "run", spec.app]
        for s in sets:
            cmd += ["--set", s]
        return cmd + worker_flags()  # no REST listener: runs never collide on its port

    def run(self, spec: RunSpec) -> Attempt:
        ckpt_dir = spec.run_dir / "ckpt"
        poller = _CheckpointPoller(ckpt_dir)
        env, cwd = ours_env_cwd()
        rec = run_monitored(
            self.command(spec, ckpt_dir),
            input_paths=spec.workload.paths,
            cwd=cwd,
            env=env,
            timeout=spec.timeout,
            log_path=spec.run_dir / "worker.log",
            on_sample=poller,
        )
        poller(0.0)
        ft = (
            f"checkpoints every {spec.interval_s:g}s, {spec.mode}, LMDB state, "
            "exactly-once file sink"
            if spec.interval_s > 0
            else "periodic checkpoints off (final checkpoint only), exactly-once file sink"
        )
        return Attempt(
            rec,
            spec.out_dir,
            {
                "parallelism": spec.parallelism,
                "checkpoint_interval_s": spec.interval_s,
                "mode": spec.mode,
                "full_every": spec.full_every or 10,
                "app": spec.app,
                "engine": str(ENGINE_SRC[0] or "working tree"),
            },
            ft,
            poller.seen,
            completed_from_lines(rec.lines),
        )


class BareLoop(System):
    """The ceiling: orjson + dict over the same input, no fault tolerance."""

    name = "bare-loop"

    def run(self, spec: RunSpec) -> Attempt:
        if len(spec.workload.paths) != 1:
            raise ValueError("bare-loop reads one input file")
        spec.out_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            str(PEERS_DIR / "bare_loop.py"),
            str(spec.workload.paths[0]),
            str(spec.out_dir / SINGLE_OUTPUT),
        ]
        rec = run_monitored(
            cmd,
            input_paths=spec.workload.paths,
            timeout=spec.timeout,
            log_path=spec.run_dir / "worker.log",
        )
        return Attempt(rec, spec.out_dir, {"parallelism": 1}, "none (ceiling)")


class _PeerSystem(System):
    env_name = ""
    dist = ""
    _env: PeerEnv | None = None

    def env(self) -> PeerEnv:
        if self._env is None:
            self._env = ensure_env(self.env_name)
        return self._env

    def unavailable_reason(self) -> str | None:
        return self.env().error

    def version(self) -> str | None:
        return version_of(self.env(), self.dist)


class Bytewax(_PeerSystem):
    """Bytewax 0.21 with recovery on: SQLite recovery partitions, snapshots every interval."""

    name = "bytewax"
    env_name = dist = "bytewax"

    def run(self, spec: RunSpec) -> Attempt:
        env = self.env()
        assert env.python is not None
        if len(spec.workload.paths) != 1:
            raise ValueError("the bytewax job reads one input file")
        spec.out_dir.mkdir(parents=True, exist_ok=True)
        rec_dir = spec.run_dir / "recovery"
        rec_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [str(env.python), "-m", "bytewax.recovery", str(rec_dir), "1"],
            check=True,
            capture_output=True,
        )
        interval = spec.interval_s if spec.interval_s > 0 else 1.0
        cmd = [
            str(env.python),
            "-m",
            "bytewax.run",
            "bytewax_pv_count:flow",
            "-r",
            str(rec_dir),
            "-s",
            f"{interval:g}",
            "-b",
            "0",
        ]
        run_env = {
            **os.environ,
            "BENCH_INPUT": str(spec.workload.paths[0]),
            "BENCH_OUTPUT": str(spec.out_dir / SINGLE_OUTPUT),
            "PYTHONPATH": str(PEERS_DIR),
        }
        rec = run_monitored(
            cmd,
            input_paths=spec.workload.paths,
            env=run_env,
            cwd=PEERS_DIR,
            timeout=spec.timeout,
            log_path=spec.run_dir / "worker.log",
        )
        return Attempt(
            rec,
            spec.out_dir,
            {
                "workers": 1,
                "snapshot_interval_s": interval,
                "backup_interval_s": 0,
                "file_source_batch_size": 1000,
            },
            f"recovery on: snapshots every {interval:g}s to SQLite partitions; FileSource "
            "offsets + FileSink truncate-on-resume (fsync per batch)",
        )
