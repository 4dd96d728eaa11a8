"""Kill -9 at random moments, restart, repeat: the harness behind the exactly-once proofs.

Used by the tests, ``make demo`` and the bench. A kill is scheduled only after
the worker has completed a checkpoint in its current attempt, so every killed
run makes progress and the loop ends; *when* after that it dies is random
(seeded), so kills land mid-batch, mid-snapshot, mid-commit alike.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_COMPLETED = re.compile(r"checkpoint (\d+) completed")


@dataclass
class ChaosResult:
    exit_code: int
    kills: int
    runs: int
    elapsed: float
    kill_times: list[float] = field(default_factory=list)


def run_with_kills(
    cmd: Sequence[str],
    *,
    kills: int,
    seed: int,
    max_delay_after_checkpoint: float = 1.0,
    timeout: float = 600.0,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    on_line: Callable[[str], None] | None = None,
) -> ChaosResult:
    """Run ``cmd`` to completion, SIGKILLing it ``kills`` times along the way."""
    rng = random.Random(seed)
    started = time.monotonic()
    result = ChaosResult(exit_code=-1, kills=0, runs=0, elapsed=0.0)
    log = open(log_path, "ab") if log_path is not None else None  # noqa: SIM115 - closed below
    try:
        while True:
            result.runs += 1
            checkpointed = threading.Event()
            proc = subprocess.Popen(
                list(cmd),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cwd,
            )
            reader = threading.Thread(
                target=_pump, args=(proc, checkpointed, log, on_line), daemon=True
            )
            reader.start()
            want_kill = result.kills < kills
            deadline = started + timeout
            delay = rng.uniform(0.0, max_delay_after_checkpoint)
            kill_at: float | None = None
            while proc.poll() is None:
                now = time.monotonic()
                if now > deadline:
                    proc.kill()
                    proc.wait()
                    raise TimeoutError(f"{cmd[0]}: did not finish within {timeout}s")
                if want_kill and kill_at is None and checkpointed.is_set():
                    kill_at = now + delay
                if kill_at is not None and now >= kill_at:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
                time.sleep(0.005)
            reader.join(timeout=5)
            if proc.returncode == -signal.SIGKILL and kill_at is not None:
                result.kills += 1
                result.kill_times.append(time.monotonic() - started)
                if log is not None:
                    log.write(f"=== chaos: SIGKILL #{result.kills} ===\n".encode())
                continue
            result.exit_code = proc.returncode
            result.elapsed = time.monotonic() - started
            return result
    finally:
        if log is not None:
            log.close()


def _pump(
    proc: subprocess.Popen[bytes],
    checkpointed: threading.Event,
    log: object,
    on_line: Callable[[str], None] | None,
) -> None:
    assert proc.stderr is not None
    for raw in proc.stderr:
        line = raw.decode(errors="replace")
        if _COMPLETED.search(line):
            checkpointed.set()
        if log is not None:
            log.write(raw)  # type: ignore[attr-defined]
        if on_line is not None:
            on_line(line.rstrip("\n"))
