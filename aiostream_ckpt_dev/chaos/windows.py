"""Kill -9 aimed at the windows where exactly-once is decided, one kill per worker run.

:mod:`.chaos` kills by time or input position; those kills rarely land in a
snapshot half written, between durable metadata and the sinks' commit, in a
recovery, or at the end of the input. Here each run of the worker is armed
with one :mod:`aiostream_ckpt.failpoints` point (``AIOSTREAM_FAILPOINTS``) or
a kill by input position, so every window is hit by plan. A *round* runs the
job to its end on fresh directories under a plan of kills: it opens with a
kill once a checkpoint is durable (a first run has nothing to restore), mixes
in the rest, and ends with the end-of-input windows. A planned kill
whose window the run never reaches (the job ended first) is not counted.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiostream_ckpt.failpoints import ENV_VAR
from aiostream_ckpt_dev.chaos import faults as chaos_faults
from aiostream_ckpt_dev.chaos.kills import read_fraction

#: Windows where the job moves on before the kill.
PROGRESS_WINDOWS = ("snapshot_write", "metadata_durable", "sink_commit", "position")
RECOVERY_WINDOWS = ("restore_begin", "restore_before_sinks", "restore_after_sinks")
END_WINDOWS = ("final_metadata_durable", "final_committed")
WINDOWS = PROGRESS_WINDOWS + RECOVERY_WINDOWS + END_WINDOWS


@dataclass(frozen=True)
class Kill:
    """Kill the run at ``window``: the ``nth`` hit of a fail point, or ``fraction`` of input."""

    window: str
    nth: int = 1
    fraction: float = 0.0

    def env(self) -> dict[str, str]:
        return {} if self.window == "position" else {ENV_VAR: f"{self.window}=kill@{self.nth}"}


@dataclass
class RoundResult:
    exit_code: int = -1
    runs: int = 0
    elapsed: float = 0.0
    #: kills that happened, by window
    kills: Counter[str] = field(default_factory=Counter)
    #: planned kills whose window the job never reached
    missed: Counter[str] = field(default_factory=Counter)
    #: faults injected (:mod:`.faults`), by kind, and what they showed wrong
    faults: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    #: committed records a fallback moved aside (found in the log)
    retracted: int = 0

    @property
    def kill_count(self) -> int:
        return sum(self.kills.values())


def plan_round(rng: random.Random, kills: int, *, position: bool = True) -> list[Kill]:
    """``kills`` kills: metadata durable first, end-of-input windows last.

    The first kill waits for a durable checkpoint, so that every later run has
    one to recover from and the recovery windows are reached.
    """
    progress = [w for w in PROGRESS_WINDOWS if position or w != "position"]
    middle = progress + list(RECOVERY_WINDOWS)
    windows = ["metadata_durable"]
    ends = list(END_WINDOWS)[: max(0, kills - 1)]
    windows += [rng.choice(middle) for _ in range(kills - 1 - len(ends))] + ends
    plan = []
    for w in windows[:kills]:
        nth = rng.randint(1, 3) if w in ("snapshot_write", "metadata_durable", "sink_commit") else 1
        plan.append(Kill(w, nth, rng.uniform(0.02, 0.25) if w == "position" else 0.0))
    return plan


def run_round(
    cmd: Sequence[str],
    plan: Sequence[Kill],
    *,
    inputs: Sequence[Path] = (),
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
    timeout: float = 600.0,
    faults: Mapping[int, Sequence[str]] | None = None,
    checkpoint_dir: Path | None = None,
) -> RoundResult:
    """Run ``cmd`` once per planned kill, then once to the end; see the module docstring.

    ``faults`` (by run index, see :func:`.faults.plan_faults`) are
    injected before those runs; ``corrupt_newest`` needs ``checkpoint_dir``.
    """
    result = RoundResult()
    started = time.monotonic()
    base = dict(os.environ if env is None else env)
    base.pop(ENV_VAR, None)
    sizes = {str(p.resolve()): p.stat().st_size for p in inputs}
    corrupted: int | None = None  # log offset where the run after a corruption starts
    with open(log_path or os.devnull, "ab") as log:
        for i, kill in enumerate([*plan, None]):
            result.runs += 1
            run_env = {**base, **(kill.env() if kill is not None else {})}
            todo = (faults or {}).get(i, ())
            victim = None
            if chaos_faults.CORRUPT_NEWEST in todo and checkpoint_dir is not None:
                victim = chaos_faults.corrupt_newest(checkpoint_dir)
            if victim is not None:
                result.faults[chaos_faults.CORRUPT_NEWEST] += 1
                log.write(f"=== chaos: corrupted {victim} ===\n".encode())
                log.flush()
                corrupted = log.tell()
            rival = checkpoint_dir if chaos_faults.TWO_SUCCESSORS in todo else None
            code = _run_once(cmd, run_env, kill, sizes, log, started + timeout, rival, result)
            if code == -signal.SIGKILL and kill is not None:
                result.kills[kill.window] += 1
                log.write(f"=== chaos: SIGKILL at {kill.window} ===\n".encode())
                continue
            # the job ended (or failed) before this kill: the rest of the plan would too
            result.missed.update(k.window for k in plan[i:])
            result.exit_code = code
            break
    if corrupted is not None and log_path is not None:
        with open(log_path, "rb") as f:
            f.seek(corrupted)
            after = f.read()
        if chaos_faults.FALLBACK_MARK.encode() not in after:
            result.problems.append("corrupt newest checkpoint: no restart fell back")
        result.retracted = sum(int(n) for n in chaos_faults.RETRACTED.findall(after))
    result.elapsed = time.monotonic() - started
    return result


def _run_once(
    cmd: Sequence[str],
    env: dict[str, str],
    kill: Kill | None,
    sizes: dict[str, int],
    log: object,
    deadline: float,
    rival_dir: Path | None = None,
    result: RoundResult | None = None,
) -> int:
    """Run ``cmd`` once, or with ``rival_dir`` (its checkpoint directory) twice at once.

    Of two, the one that runs is watched; the other must have been refused.
    """
    procs = [
        subprocess.Popen(list(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        for _ in range(2 if rival_dir is not None else 1)
    ]
    lines: list[list[str]] = [[] for _ in procs]  # kept for a rival's refusal only
    pumps = [
        threading.Thread(target=_pump, args=(p, log, lines[i] if rival_dir else None), daemon=True)
        for i, p in enumerate(procs)
    ]
    for t in pumps:
        t.start()
    proc = procs[0]
    if rival_dir is not None:
        owner = chaos_faults.hold_owner_until_refused(procs, rival_dir, deadline)
        proc, pump = procs[owner], pumps[owner]
        pumps[1 - owner].join(timeout=5)
        problem = chaos_faults.refusal_problem(procs[1 - owner], "".join(lines[1 - owner]), proc)
        assert result is not None
        result.faults[chaos_faults.TWO_SUCCESSORS] += 1
        if problem is not None:
            result.problems.append(problem)
    else:
        pump = pumps[0]
    by_position = kill is not None and kill.window == "position"
    run_start: float | None = None
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise TimeoutError(f"{cmd[0]}: did not finish in time")
        if by_position and sizes:
            assert kill is not None
            read = read_fraction(proc.pid, sizes)
            if run_start is None and read > 0:
                run_start = read
            if run_start is not None and read >= min(run_start + kill.fraction, 0.99):
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                break
        time.sleep(0.005 if by_position else 0.02)
    pump.join(timeout=5)
    return proc.returncode


def _pump(proc: subprocess.Popen[bytes], log: object, lines: list[str] | None) -> None:
    assert proc.stderr is not None
    for raw in proc.stderr:
        log.write(raw)  # type: ignore[attr-defined]
        if lines is not None:
            lines.append(raw.decode(errors="replace"))
