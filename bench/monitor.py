"""Run one worker process and watch it from outside, the same way for every system.

Progress is the read position of the input file, taken from
``/proc/<pid>/fdinfo`` of whichever process in the worker's tree has the file
open: no system needs instrumenting, so ours, the bare loop and every peer are
measured alike. Peak RSS comes from ``wait4``'s rusage of the child (and of its
reaped children), and from sampling ``VmRSS`` over the process tree for
systems that keep helper processes (PyFlink's JVM) alive until the end.
CPU seconds (user+sys) come from ``wait4`` too (the whole tree, exact), and
are split per process from ``/proc/<pid>/stat`` samples (:class:`CpuSplit`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SAMPLE_EVERY = 0.05
_TICK = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


@dataclass
class ProcessRecord:
    """What one run of a worker showed: exit, wall time, progress samples, log lines."""

    cmd: list[str]
    exit_code: int
    wall_s: float
    #: (seconds since spawn, bytes of input read)
    positions: list[tuple[float, float]] = field(default_factory=list)
    #: (seconds since spawn, bytes read of each input file, in ``input_paths`` order)
    reader_positions: list[tuple[float, tuple[float, ...]]] = field(default_factory=list)
    #: (seconds since spawn, stderr line)
    lines: list[tuple[float, str]] = field(default_factory=list)
    peak_rss_kb: int = 0
    timed_out: bool = False
    #: user+sys CPU seconds: the whole tree and per process (see :class:`CpuSplit`)
    cpu: dict[str, Any] = field(default_factory=dict)

    def tail(self, n: int = 15) -> str:
        return "\n".join(line for _, line in self.lines[-n:])


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
    except OSError:
        pass
    return out


def process_tree(pid: int) -> list[int]:
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(_children(p))
    return seen


def _rss_kb(pid: int) -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` of ``pid`` in kB: its resident set now and its own peak.

    VmHWM belongs to the process's address space, which ``exec`` makes anew, so
    unlike ``wait4``'s ``ru_maxrss`` it does not start at the RSS of the parent
    that spawned it (Linux carries the pre-exec peak into ``ru_maxrss``: a run
    started by a bench holding a big input in memory reported the bench's size).
    """
    rss = hwm = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                    break  # VmRSS follows VmHWM
    except OSError:
        pass
    return rss, hwm


def _stat_cpu(pid: int) -> tuple[float, float] | None:
    """(own, reaped children's) user+sys CPU seconds of ``pid``, from ``/proc/<pid>/stat``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()  # from field 3 (state) on
    own = (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
    return own, (int(fields[13]) + int(fields[14])) / _TICK  # cutime, cstime


class CpuSplit:
    """CPU seconds per process of a tree: the root (the main process) and its children.

    ``wait4`` gives the whole tree's CPU exactly, once the root has exited.
    The children (worker processes) are sampled while they run; the root's
    own share is the total less what its reaped children used (its
    ``cutime``), or less the children's last samples if it exited between
    reaping and the next sample. So the workers' figures may miss their last
    sample interval (longer than the nominal one on a loaded machine); what
    they missed is known in sum once the root has reaped them (its
    ``cutime`` against their samples) and reported as ``children_unsampled_s``,
    so main + children + unsampled is the exact total.
    """

    def __init__(self) -> None:
        self.children: dict[int, float] = {}
        self.reaped = 0.0

    def sample(self, root: int, tree: list[int]) -> None:
        for pid in tree:
            got = _stat_cpu(pid)
            if got is None:
                continue
            if pid == root:
                self.reaped = got[1]
            else:
                self.children[pid] = got[0]

    def split(self, total: float) -> dict[str, Any]:
        workers = [round(self.children[p], 2) for p in sorted(self.children)]
        in_children = max(self.reaped, sum(workers))
        main = round(max(total - in_children, 0.0), 2)
        return {
            "total_s": round(total, 2),
            "main_s": main,
            "children_s": workers,
            #: the children's CPU after their last sample (reaped: in cutime, not sampled)
            "children_unsampled_s": round(max(total - main - sum(workers), 0.0), 2),
        }


def _find_fd(pids: Sequence[int], target: str) -> tuple[int, str] | None:
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return pid, fd
            except OSError:
                continue
    return None


def _points_at(pid: int, fd: str, target: str) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}") == target
    except OSError:
        return False


def _fd_pos(pid: int, fd: str) -> int | None:
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("pos:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class _Pump(threading.Thread):
    def __init__(
        self,
        stream: object,
        t0: float,
        sink: list[tuple[float, str]],
        on_line: Callable[[float, str], None] | None,
        log: Path | None,
    ) -> None:
        super().__init__(daemon=True)
        self.stream, self.t0, self.sink, self.on_line, self.log = stream, t0, sink, on_line, log

    def run(self) -> None:
        logf = open(self.log, "ab") if self.log else None  # noqa: SIM115
        try:
            for raw in self.stream:  # type: ignore[attr-defined]
                t = time.monotonic() - self.t0
                if logf is not None:
                    logf.write(raw)
                line = raw.decode(errors="replace").rstrip("\n")
                self.sink.append((t, line))
                if self.on_line is not None:
                    self.on_line(t, line)
        finally:
            if logf is not None:
                logf.close()


class _Progress:
    """Bytes read over several input files: an fd that closes after being seen counts whole."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.targets = {str(p.resolve()): p.stat().st_size for p in paths}
        self.where: dict[str, tuple[int, str]] = {}
        self.pos = dict.fromkeys(self.targets, 0)
        self.done: set[str] = set()

    def sample(self, root: int) -> float | None:
        missing = [t for t in self.targets if t not in self.where and t not in self.done]
        if missing:
            tree = process_tree(root)
            for t in missing:
                found = _find_fd(tree, t)
                if found is not None:
                    self.where[t] = found
        for t, loc in list(self.where.items()):
            # the fd number may be reused for another file once the input is closed
            pos = _fd_pos(*loc) if _points_at(*loc, t) else None
            if pos is None:
                del self.where[t]
                if self.pos[t] > 0:
                    self.done.add(t)
                    self.pos[t] = self.targets[t]
            else:
                self.pos[t] = max(self.pos[t], min(pos, self.targets[t]))
        if not self.where and not self.done:
            return None
        return float(sum(self.pos.values()))

    def per_file(self) -> tuple[float, ...]:
        """Bytes read of each file, in the order of the paths given (after :meth:`sample`)."""
        return tuple(float(v) for v in self.pos.values())


def run_monitored(
    cmd: Sequence[str],
    *,
    input_paths: Sequence[Path] = (),
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 600.0,
    log_path: Path | None = None,
    on_line: Callable[[float, str], None] | None = None,
    on_sample: Callable[[float], None] | None = None,
) -> ProcessRecord:
    """Run ``cmd`` to its end (or ``timeout``), sampling progress and memory."""
    progress = _Progress(input_paths) if input_paths else None
    t0 = time.monotonic()
    proc = subprocess.Popen(
        list(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd
    )
    rec = ProcessRecord(cmd=list(cmd), exit_code=-1, wall_s=0.0)
    pump = _Pump(proc.stderr, t0, rec.lines, on_line, log_path)
    pump.start()
    sampled_peak = 0
    cpu = CpuSplit()
    n = 0
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            now = time.monotonic() - t0
            if pid != 0:
                rec.exit_code = os.waitstatus_to_exitcode(status)
                proc.returncode = rec.exit_code
                rec.wall_s = now
                # not usage.ru_maxrss: it starts at the bench's own RSS (see _rss_kb)
                rec.peak_rss_kb = sampled_peak
                rec.cpu = cpu.split(usage.ru_utime + usage.ru_stime)
                break
            if now > timeout:
                rec.timed_out = True
                _kill_tree(proc.pid)
                continue
            if progress is not None:
                pos = progress.sample(proc.pid)
                if pos is not None:
                    rec.positions.append((now, pos))
                    rec.reader_positions.append((now, progress.per_file()))
            # the root's own peak at every sample (it has run up to now); the tree's
            # summed RSS now and then (children peak at different times)
            sampled_peak = max(sampled_peak, _rss_kb(proc.pid)[1])
            if n % 2 == 0:
                tree = process_tree(proc.pid)
                cpu.sample(proc.pid, tree)
                if n % 4 == 0:
                    sizes = [_rss_kb(p) for p in tree]
                    sampled_peak = max(
                        sampled_peak, sum(r for r, _ in sizes), max(h for _, h in sizes)
                    )
            if on_sample is not None:
                on_sample(now)
            n += 1
            time.sleep(SAMPLE_EVERY)
    finally:
        if proc.returncode is None:
            _kill_tree(proc.pid)
            proc.wait()
        pump.join(timeout=10)
    return rec


def _kill_tree(pid: int) -> None:
    for p in reversed(process_tree(pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, 9)


def _cpu_times() -> tuple[float, float]:
    with open("/proc/stat") as f:
        parts = [float(x) for x in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0.0)
    return sum(parts), idle


def busy_cores(window: float = 0.5) -> float:
    """How many cores' worth of CPU the machine spent busy over ``window`` seconds."""
    total0, idle0 = _cpu_times()
    time.sleep(window)
    total1, idle1 = _cpu_times()
    dt = total1 - total0
    if dt <= 0:
        return 0.0
    return (1.0 - (idle1 - idle0) / dt) * (os.cpu_count() or 1)


def wait_for_quiet(
    *, threshold: float = 0.25, max_wait: float = 60.0, say: Callable[[str], None] | None = None
) -> float:
    """Wait until other processes use less than ``threshold`` cores; returns the last reading.

    On a shared 2-core machine a background JVM halves a Python worker's
    throughput, so every timed run starts on a quiet machine or says it did not.
    """
    deadline = time.monotonic() + max_wait
    busy = busy_cores()
    warned = False
    while busy > threshold and time.monotonic() < deadline:
        if say is not None and not warned:
            say(
                f"machine busy ({busy:.2f} cores used by other processes); waiting up to "
                f"{max_wait:.0f}s for quiet ..."
            )
            warned = True
        busy = busy_cores(1.0)
    return busy
