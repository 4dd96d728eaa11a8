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

At ``job.workers`` > 1 the windows of tasks (:data:`WORKER_WINDOWS`) are hit
in a worker process, armed in the run's first attempt only (see
:mod:`aiostream_ckpt.failpoints`), and a kill by position takes a worker or
the main process. A worker's kill fails the attempt, which the main process
restarts from the latest checkpoint; once that attempt has completed a
checkpoint the main process is killed too (:data:`MAIN_RUNNING`), at a
random moment, and the next run of the plan starts.

A :data:`HANG` (``plan_round(hangs=True)``, ``job.workers`` > 1) SIGSTOPs a
worker at an input position instead of killing it: hung alive, its control
connection open, it is seen only by its missing heartbeats. The main process
must kill it (``job.heartbeat_timeout``) and restart every worker; once the
restarted attempt completed a checkpoint the main process is killed as after
a worker's kill. A hang the heartbeats did not catch is a problem of the round.
"""

from __future__ import annotations

import os
import random
import re
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
from aiostream_ckpt_dev.chaos.kills import read_fraction, worker_pids

#: Windows where the job moves on before the kill.
PROGRESS_WINDOWS = (
    "pre_barrier_flush",
    "snapshot_write",
    "metadata_durable",
    "sink_commit",
    "position",
)
RECOVERY_WINDOWS = ("restore_begin", "restore_before_sinks", "restore_after_sinks")
#: The Delta sink's windows (``app.sink=delta``): its data files written at a barrier, in
#: no commit; a complete checkpoint before its Delta commit; after it, no task told yet.
DELTA_WINDOWS = ("delta_files_written", "delta_commit", "delta_committed")
END_WINDOWS = ("final_metadata_durable", "final_committed")
#: Windows of unaligned checkpoints (``checkpoint.unaligned=true``): in-flight records
#: being written with a checkpoint, and being replayed after a restore.
UNALIGNED_WINDOWS = ("channel_state_write", "channel_state_replay")
WINDOWS = PROGRESS_WINDOWS + RECOVERY_WINDOWS + END_WINDOWS + UNALIGNED_WINDOWS
#: Windows of tasks: at ``job.workers`` > 1 hit in a worker process, not in the main one.
WORKER_WINDOWS = (
    "pre_barrier_flush",
    "snapshot_write",
    "sink_commit",
    "delta_files_written",
    *RECOVERY_WINDOWS,
    "final_committed",
    *UNALIGNED_WINDOWS,
)
#: Windows hit at every checkpoint: a plan's kill takes the 1st to 3rd hit.
_NTH_WINDOWS = (
    "pre_barrier_flush",
    "snapshot_write",
    "metadata_durable",
    "sink_commit",
    *DELTA_WINDOWS,
    "channel_state_write",
)
#: The kill of the main process that follows a worker's once its restart checkpointed.
MAIN_RUNNING = "main_running"
#: SIGSTOP a worker process at an input position (a hung worker), see the module docstring.
HANG = "hang"
_COMPLETED = re.compile(rb"checkpoint \d+ completed")
#: the main process's failure of a hung worker (``runtime.workers.worker_group``)
_HEARTBEAT_FAILURE = b"(job.heartbeat_timeout): hung, killed"


@dataclass(frozen=True)
class Kill:
    """Kill the run at ``window``: the ``nth`` hit of a fail point, or ``fraction`` of input."""

    window: str
    nth: int = 1
    fraction: float = 0.0
    #: ``job.workers`` > 1: the worker process (by index) a position kill takes, else the main
    worker: int | None = None
    #: seconds between a worker's kill's restart checkpointing and the main process's kill
    after: float = 0.0

    @property
    def by_position(self) -> bool:
        """Whether it happens at an input position (a kill or a hang), not at a fail point."""
        return self.window in ("position", HANG)

    def env(self) -> dict[str, str]:
        return {} if self.by_position else {ENV_VAR: f"{self.window}=kill@{self.nth}"}

    def in_worker(self, workers: int) -> bool:
        """Whether this kill takes a worker process of a job with ``workers`` of them."""
        if workers <= 1:
            return False
        if self.by_position:
            return self.worker is not None
        return self.window in WORKER_WINDOWS

    def label(self, workers: int) -> str:
        """Return the window as counted: ``worker:`` before it when a worker was killed."""
        return f"worker:{self.window}" if self.in_worker(workers) else self.window


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


def plan_round(
    rng: random.Random,
    kills: int,
    *,
    position: bool = True,
    workers: int = 1,
    hangs: bool = False,
    delta: bool = False,
    unaligned: bool = False,
) -> list[Kill]:
    """``kills`` kills: metadata durable first, end-of-input windows last.

    The first kill waits for a durable checkpoint, so that every later run has
    one to recover from and the recovery windows are reached. With ``workers``
    > 1, half the position kills take a worker (see the module docstring).
    ``delta``: the job writes a Delta table; its windows join the mix.
    ``hangs``: the kills between are :data:`HANG` of a worker (the input's
    position needed), each followed by the main process's kill. ``unaligned``
    (``checkpoint.unaligned=true``): the windows of in-flight records too
    (:data:`UNALIGNED_WINDOWS`), twice as often as another window each.
    """
    if hangs and (workers <= 1 or not position):
        raise ValueError("hangs need job.workers > 1 and input files to place them by")
    progress = [w for w in PROGRESS_WINDOWS if position or w != "position"]
    if delta:
        progress += DELTA_WINDOWS
    middle = [HANG] if hangs else progress + list(RECOVERY_WINDOWS)
    if unaligned and not hangs:
        middle += [*UNALIGNED_WINDOWS, *UNALIGNED_WINDOWS]
    windows = ["metadata_durable"]
    ends = list(END_WINDOWS)[: max(0, kills - 1)]
    windows += [rng.choice(middle) for _ in range(kills - 1 - len(ends))] + ends
    plan = []
    for w in windows[:kills]:
        nth = rng.randint(1, 3) if w in _NTH_WINDOWS else 1
        fraction = rng.uniform(0.02, 0.25) if w in ("position", HANG) else 0.0
        worker = None
        if w == HANG or (w == "position" and workers > 1 and rng.random() < 0.5):
            worker = rng.randrange(workers)
        after = rng.uniform(0.0, 0.5) if workers > 1 else 0.0
        plan.append(Kill(w, nth, fraction, worker, after))
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
    workers: int = 1,
) -> RoundResult:
    """Run ``cmd`` once per planned kill, then once to the end; see the module docstring.

    ``faults`` (by run index, see :func:`.faults.plan_faults`) are
    injected before those runs; ``corrupt_newest`` needs ``checkpoint_dir``.
    ``workers``: the job's ``job.workers``.
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
            in_worker = kill is not None and kill.in_worker(workers)
            code, worker_killed = _run_once(
                cmd, run_env, kill, sizes, log, started + timeout, rival, result, in_worker
            )
            if worker_killed:
                assert kill is not None
                result.kills[kill.label(workers)] += 1
                how = "SIGSTOP" if kill.window == HANG else "SIGKILL"
                log.write(f"=== chaos: worker {how} at {kill.window} ===\n".encode())
                if code == -signal.SIGKILL:
                    result.kills[MAIN_RUNNING] += 1
                    log.write(f"=== chaos: SIGKILL at {MAIN_RUNNING} ===\n".encode())
                    continue
                # the job ended before the main process's kill: so would the rest of the plan
                result.missed.update(k.window for k in plan[i + 1 :])
                result.exit_code = code
                break
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
    in_worker: bool = False,
) -> tuple[int, bool]:
    """Run ``cmd`` once, or with ``rival_dir`` (its checkpoint directory) twice at once.

    Of two, the one that runs is watched; the other must have been refused.
    Returns the exit code and whether a worker process was killed
    (``in_worker``: the kill is planned to take one, see the module docstring).
    """
    procs = [
        subprocess.Popen(list(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        for _ in range(2 if rival_dir is not None else 1)
    ]
    lines: list[list[str]] = [[] for _ in procs]  # kept for a rival's refusal only
    by_position = kill is not None and kill.by_position
    hang = kill is not None and kill.window == HANG
    seen = _Seen(watch_failpoint=in_worker and not by_position, hang=hang)
    pumps = [
        threading.Thread(
            target=_pump, args=(p, log, lines[i] if rival_dir else None, seen), daemon=True
        )
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
    run_start: float | None = None
    kill_main_at: float | None = None
    while proc.poll() is None:
        now = time.monotonic()
        if now > deadline:
            proc.kill()
            proc.wait()
            raise TimeoutError(f"{cmd[0]}: did not finish in time")
        if by_position and sizes and not seen.worker_killed.is_set():
            assert kill is not None
            read = read_fraction(proc.pid, sizes)
            if run_start is None and read > 0:
                run_start = read
            if run_start is not None and read >= min(run_start + kill.fraction, 0.99):
                if not in_worker:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
                victims = worker_pids(proc.pid)
                if victims:  # else between attempts: try again
                    assert kill.worker is not None
                    how = signal.SIGSTOP if hang else signal.SIGKILL
                    os.kill(victims[kill.worker % len(victims)], how)
                    seen.worker_killed.set()
        if kill_main_at is None and seen.checkpoint_after.is_set():
            assert kill is not None
            kill_main_at = now + kill.after
        if kill_main_at is not None and now >= kill_main_at:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        time.sleep(0.005 if by_position else 0.02)
    pump.join(timeout=5)
    if hang and seen.worker_killed.is_set() and not seen.caught.is_set() and result is not None:
        result.problems.append("a worker hung (SIGSTOP) and no heartbeat timeout failed it")
    return proc.returncode, seen.worker_killed.is_set()


class _Seen:
    """What a run's log showed: a worker killed (by a fail point, or by us), a checkpoint after.

    ``hang``: the worker was stopped, not killed; a checkpoint counts only once
    the main process failed it by its heartbeats (:attr:`caught`): one that
    completes in between was acknowledged before the stop.
    """

    def __init__(self, *, watch_failpoint: bool, hang: bool = False) -> None:
        self._watch_failpoint = watch_failpoint
        self.worker_killed = threading.Event()
        self.checkpoint_after = threading.Event()
        self.caught = threading.Event()
        if not hang:
            self.caught.set()

    def line(self, raw: bytes) -> None:
        if self.worker_killed.is_set():
            if _HEARTBEAT_FAILURE in raw:
                self.caught.set()
            elif self.caught.is_set() and _COMPLETED.search(raw):  # the restarted attempt's
                self.checkpoint_after.set()
        elif self._watch_failpoint and raw.startswith(b"failpoint "):
            self.worker_killed.set()


def _pump(proc: subprocess.Popen[bytes], log: object, lines: list[str] | None, seen: _Seen) -> None:
    assert proc.stderr is not None
    for raw in proc.stderr:
        log.write(raw)  # type: ignore[attr-defined]
        seen.line(raw)
        if lines is not None:
            lines.append(raw.decode(errors="replace"))
