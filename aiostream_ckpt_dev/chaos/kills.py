"""Kill -9 at random moments, restart, repeat: the harness behind the exactly-once proofs.

Used by the tests, ``make demo`` and the bench. A kill is scheduled only after
the worker has completed a checkpoint in its current attempt, so every killed
run makes progress and the loop ends; *when* after that it dies is random
(seeded), so kills land mid-batch, mid-snapshot, mid-commit alike.

Given the job's input files, kills are placed by how far the worker has read
instead (Linux: ``/proc/<pid>/fdinfo``): the i-th kill at a random point of
the i-th of ``kills`` equal slices of 10-90 % of the file it is furthest in,
once some checkpoint has completed and the current run has read on by 1 % of
that file (so a restarted run is not killed before it did anything). Exact
for one file per reader (the demo, the tests); a reader that reads several
files one after another gets its kills in its first file. Time-based kills
race a fast job's end (at ~1 M events/s the demo's 3 M events often ended
before the second kill); these happen however fast the job runs, but never
during the end of the input (its final checkpoint and commit), which
time-based kills still cover in the at-least-once and Kafka tests. Except
that the first kill waits for a checkpoint: a job that reads all its input
before its first checkpoint completes (15 k events on an idle machine) is
never killed. The tests pace their input (``JsonLinesFileSource(rate=...)``)
so that a pass spans tens of checkpoint intervals on any machine.
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
    #: of ``kills``, those that hit a worker process (``kill_workers``, ``hang_workers``)
    worker_kills: int = 0


def run_with_kills(
    cmd: Sequence[str] | Callable[[int], Sequence[str]],
    *,
    kills: int,
    seed: int,
    max_delay_after_checkpoint: float = 1.0,
    timeout: float = 600.0,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    on_line: Callable[[str], None] | None = None,
    inputs: Sequence[Path] | None = None,
    kill_workers: bool = False,
    hang_workers: bool = False,
) -> ChaosResult:
    """Run ``cmd`` to completion, SIGKILLing it ``kills`` times along the way.

    With ``inputs`` (files the worker reads) and a ``/proc`` to watch it by,
    kill points are fractions of the input (see the module docstring).

    ``kill_workers`` (``job.workers`` > 1): each kill picks, by the seed, the
    main process or one of its worker processes. A killed worker fails the
    attempt and the main process restarts it; the next kill waits for a
    checkpoint completed after it, as after a restart of the command.

    ``hang_workers``: instead, each "kill" SIGSTOPs one worker process (never
    the main one): a worker hung alive, which the main process must see by
    its heartbeats (``job.heartbeat_timeout``), kill and restart.

    ``cmd`` may be a function of the run's number (1, 2, ...) returning its
    command: a restart with other settings (a rescale: ``job.parallelism``).
    """
    rng = random.Random(seed)
    started = time.monotonic()
    result = ChaosResult(exit_code=-1, kills=0, runs=0, elapsed=0.0)
    here = Path(cwd) if cwd is not None else Path.cwd()  # where the worker resolves them
    sizes = {str((here / p).resolve()): (here / p).stat().st_size for p in inputs or ()}
    by_progress = bool(sizes) and Path("/proc/self/fdinfo").is_dir()
    span = 0.8 / max(kills, 1)
    targets = [rng.uniform(0.1 + i * span, 0.1 + (i + 1) * span) for i in range(kills)]
    any_checkpoint = False
    log = open(log_path, "ab") if log_path is not None else None  # noqa: SIM115 - closed below
    proc: subprocess.Popen[bytes] | None = None
    known: set[int] = set()
    try:
        while True:
            result.runs += 1
            checkpointed = threading.Event()
            argv = list(cmd(result.runs) if callable(cmd) else cmd)
            known = _children()
            proc = subprocess.Popen(
                argv,
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
            run_start: float | None = None  # where this run began reading
            while proc.poll() is None:
                now = time.monotonic()
                if now > deadline:
                    proc.kill()
                    proc.wait()
                    raise TimeoutError(f"{argv[0]}: did not finish within {timeout}s")
                any_checkpoint = any_checkpoint or checkpointed.is_set()
                if by_progress and want_kill:
                    read = read_fraction(proc.pid, sizes)
                    if run_start is None and read > 0:
                        run_start = read
                    if (
                        any_checkpoint
                        and run_start is not None
                        and read >= max(targets[result.kills], run_start + 0.01)
                    ):
                        kill_at = now
                elif want_kill and kill_at is None and checkpointed.is_set():
                    kill_at = now + delay
                if kill_at is not None and now >= kill_at:
                    if hang_workers:
                        workers = worker_pids(proc.pid)
                        if not workers:  # between attempts: no worker to stop yet
                            time.sleep(0.005)
                            continue
                        victim, sig = rng.choice(workers), signal.SIGSTOP
                    else:
                        victim = _victim(proc.pid, rng) if kill_workers else proc.pid
                        sig = signal.SIGKILL
                    os.kill(victim, sig)
                    if victim == proc.pid:
                        proc.wait()
                        break
                    result.kills += 1
                    result.worker_kills += 1
                    result.kill_times.append(now - started)
                    if log is not None:
                        line = f"=== chaos: {sig.name} #{result.kills} (worker {victim}) ===\n"
                        log.write(line.encode())
                    # as after a restart: wait for a checkpoint of the new attempt
                    checkpointed.clear()
                    any_checkpoint = False
                    run_start = kill_at = None
                    want_kill = result.kills < kills
                    delay = rng.uniform(0.0, max_delay_after_checkpoint)
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
    except BaseException:
        # interrupted inside Popen (the child started, ``proc`` not yet set): it goes too
        _kill_new_children(known, proc)
        raise
    finally:
        # interrupted (SIGTERM/SIGINT of the demo, a timeout): the worker goes too
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if log is not None:
            log.close()


def _children(pid: int | None = None) -> set[int]:
    """Return the child processes of ``pid`` (default: this process), of every thread."""
    task = f"/proc/{'self' if pid is None else pid}/task"
    out: set[int] = set()
    try:
        threads = os.listdir(task)
    except OSError:
        return out
    for tid in threads:
        try:
            with open(f"{task}/{tid}/children") as f:
                out.update(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def _kill_new_children(known: set[int], proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL and reap the children started since ``known`` was taken, but ``proc``.

    Why: a SIGTERM of the demo lands in the Popen of a restart once the child
    exists but before Popen returns; the SystemExit leaves that child
    unassigned, running with no one to stop it (CI, under load: "the worker
    was left running"). Told apart by pid, not command line: a child's
    ``/proc`` cmdline is empty until its exec.
    """
    for pid in _children() - known:
        if proc is not None and pid == proc.pid:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (OSError, ChildProcessError):
            continue


def _victim(pid: int, rng: random.Random) -> int:
    """Return ``pid`` or one of its worker processes, chosen by ``rng``."""
    return rng.choice([pid, *worker_pids(pid)])


def worker_pids(pid: int) -> list[int]:
    """Return the live worker processes of main process ``pid`` (``job.workers`` > 1), sorted."""
    return sorted(p for p in family(pid)[1:] if _is_worker(p))


def _is_worker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"aiostream_ckpt.daemon.worker" in f.read()
    except OSError:
        return False


def read_fraction(pid: int, sizes: dict[str, int]) -> float:
    """How far ``pid`` or a descendant has read the furthest of the files ``sizes`` lists, 0..1.

    From the offsets of their open descriptors; a file none holds open
    counts 0 (a job reads its files to the end while holding them). The
    descendants count because with ``job.workers`` > 1 the worker processes
    read the input, not the main process that is killed.
    """
    return max((_read_fraction(p, sizes) for p in family(pid)), default=0.0)


def family(pid: int) -> list[int]:
    """Return ``pid`` and its descendants (Linux ``/proc/<pid>/task/*/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(_children(p))
    return out


def _read_fraction(pid: int, sizes: dict[str, int]) -> float:
    best = 0.0
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return best
    for fd in fds:
        try:
            size = sizes.get(os.readlink(f"/proc/{pid}/fd/{fd}"))
            if not size:
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                pos = int(info.readline().split()[1])  # "pos:\t<offset>"
        except (OSError, ValueError, IndexError):
            continue  # closed meanwhile
        best = max(best, pos / size)
    return best


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
