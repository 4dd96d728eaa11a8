"""kill -9 at every point of a triggered savepoint, then a restart, then a restore of it.

A savepoint reported complete must stay restorable whatever happens to the
job after it (issue #36). For each fail point on a savepoint's path
(:data:`aiostream_ckpt.failpoints.SAVEPOINT_POINTS`: trigger, a task's
snapshot and copy, durable metadata, the caller's answer, the next
checkpoint's durable metadata, a commit of the savepoint's output), at
``job.workers`` 1 and 2, one scenario:

1. run the app as a daemon with that point armed; once checkpoint 1
   completed, ``POST /savepoints``; the process that reaches the point dies
   (a worker's kill is followed by the main process's at once: the machine
   died);
2. a caller told the savepoint completed must find it complete on disk;
3. restart on the same directories to the end of the input and prove the
   output against a failure-free reference run;
4. restore every complete savepoint into a fresh checkpoint directory, on
   the same output (``--allow-retract-output``), to the end, and prove the
   output again.

``make chaos`` runs the whole matrix (:mod:`.suite`); the integration tests
a few scenarios.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiostream_ckpt.api.contract import ProofContract
from aiostream_ckpt.checkpoint.metadata import METADATA_FILE
from aiostream_ckpt.failpoints import ENV_VAR, SAVEPOINT_POINTS
from aiostream_ckpt_dev.chaos.cli import ChaosVerdict, prove_round
from aiostream_ckpt_dev.chaos.kills import worker_pids
from aiostream_ckpt_dev.validate.proof import AppRun

#: Points hit in a worker process at ``job.workers`` > 1 (tasks'); the rest in the main one.
WORKER_POINTS = frozenset({"savepoint_snapshot", "savepoint_output_commit"})
_TOKEN = "savepoint-kills"


@dataclass
class Scenario:
    """One kill on a savepoint's path and what followed it."""

    point: str
    workers: int
    killed: bool = False
    #: what ``POST /savepoints`` answered before the kill (None: no answer)
    answer: dict[str, Any] | None = None
    savepoints: list[Path] = field(default_factory=list)
    #: the savepoints restored (and proven) after the restart
    restored: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        where = "worker" if self.workers > 1 and self.point in WORKER_POINTS else "main"
        return f"{self.point}@{where},w{self.workers}"


def run_scenario(
    run: AppRun,
    contract: ProofContract,
    reference: Path,
    workdir: Path,
    point: str,
    workers: int,
    *,
    verdict: ChaosVerdict,
    pace: Sequence[str] = (),
    timeout: float = 300.0,
) -> Scenario:
    """Run one scenario (see the module docstring) in ``workdir``; add its proofs to ``verdict``.

    ``run`` holds the app's settings (its input and output; this scenario adds
    its directories); ``reference`` is a failure-free run's (:func:`reference_run`);
    ``pace``: settings for the first run only (``app.rate``: the savepoint and
    the checkpoint after it must come before the end of the input).
    """
    sc = Scenario(point, workers)
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt, savepoints = workdir / "checkpoints", workdir / "savepoints"
    base = [
        *run.sets,
        f"errors.dead_letter_dir={workdir / 'dead-letter'}",
        *(f"app.{p}={workdir / f'out-{p}'}" for p in contract.outputs),
        f"job.workers={workers}",
    ]
    log = workdir / "daemon.log"
    first = [*base, *pace, f"checkpoint.dir={ckpt}", f"savepoint.dir={savepoints}", "rest.port=0"]
    env = {**os.environ, ENV_VAR: f"{point}=kill", "AIOSTREAM_REST__TOKEN": _TOKEN}
    deadline = time.monotonic() + timeout
    with open(log, "ab") as out:
        sc.killed, sc.answer = _kill_on_savepoint(run.module, first, env, out, point, deadline)
    if not sc.killed:
        sc.problems.append(f"{sc.label}: the point was never reached; see {log}")
        return sc
    sc.savepoints = sorted(p.parent for p in savepoints.glob(f"*/{METADATA_FILE}"))
    if sc.answer is not None and Path(sc.answer["path"]) not in sc.savepoints:
        sc.problems.append(f"{sc.label}: savepoint {sc.answer} was answered but is not on disk")
    plain = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    steps: list[tuple[str, list[str], Path | None]] = [
        ("restart", [*base, f"checkpoint.dir={ckpt}"], None)
    ]
    for i, sp in enumerate(sc.savepoints):
        fresh = [*base, f"checkpoint.dir={workdir / f'checkpoints-restore-{i}'}"]
        steps.append((f"restore of {sp.name}", fresh, sp))
    for what, sets, restoring in steps:
        flags = [] if restoring is None else ["--from-savepoint", str(restoring)]
        flags += ["--allow-retract-output"] if restoring is not None else []
        cmd = _cmd(run.module, [*sets, "rest.enabled=false"], flags)
        with open(log, "ab") as out:
            out.write(f"=== {what} ===\n".encode())
            out.flush()
            left = max(10.0, deadline - time.monotonic())
            code = subprocess.run(cmd, stdout=out, stderr=out, env=plain, timeout=left).returncode
        if code != 0:
            sc.problems.append(f"{sc.label}: the {what} exited {code}; see {log}")
            return sc
        before = len(verdict.problems)
        label = f"{sc.label} after the {what}"
        prove_round(verdict, label, AppRun(run.module, sets), contract, reference, None)
        sc.problems += verdict.problems[before:]
        del verdict.problems[before:]
        if restoring is not None:
            sc.restored.append(restoring)
    return sc


def _cmd(module: str, sets: Sequence[str], flags: Sequence[str]) -> list[str]:
    cmd = [sys.executable, "-m", "aiostream_ckpt.daemon.cli", "run", module, *flags]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def _kill_on_savepoint(
    module: str,
    sets: list[str],
    env: dict[str, str],
    log: Any,
    point: str,
    deadline: float,
) -> tuple[bool, dict[str, Any] | None]:
    """Start the daemon, trigger a savepoint once checkpoint 1 completed, wait for the kill.

    Returns whether the point killed a process, and the savepoint request's
    answer when one came back (200) before the kill.
    """
    from aiostream_ckpt.daemon.client import request

    proc = subprocess.Popen(
        _cmd(module, sets, []), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    seen = _Lines(proc, log)
    answer: dict[str, Any] | None = None
    try:
        url = seen.wait_for("REST API listening on http://", deadline)
        seen.wait_for("checkpoint 1 completed", deadline)
        if url is None or proc.poll() is not None:
            return False, None
        port = url.rsplit(":", 1)[1].split()[0].rstrip("/")
        got: list[Any] = []

        def ask() -> None:
            try:
                got.append(request("POST", f"http://127.0.0.1:{port}/savepoints", token=_TOKEN))
            except OSError as exc:  # the daemon died before it answered
                got.append(exc)

        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        fired = seen.wait_for(f"failpoint {point}: SIGKILL", deadline)
        if fired is not None and proc.poll() is None:
            # a worker died there: so does the main process (the machine went down)
            pids = worker_pids(proc.pid)
            proc.send_signal(signal.SIGKILL)
            for pid in pids:
                _wait_gone(pid, deadline)
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        asking.join(timeout=max(1.0, deadline - time.monotonic()))
        if got and isinstance(got[0], tuple) and got[0][0] == 200:
            answer = dict(got[0][1])
        return fired is not None, answer
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        seen.close()


def _wait_gone(pid: int, deadline: float) -> None:
    """Wait for a worker to die with its parent (``PR_SET_PDEATHSIG``)."""
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.01)


class _Lines:
    """The daemon's stderr, copied to the log and searched by line as it comes."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Any) -> None:
        self._proc, self._log = proc, log
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self._ended = False
        self._pump = threading.Thread(target=self._run, daemon=True)
        self._pump.start()

    def _run(self) -> None:
        assert self._proc.stderr is not None
        for raw in self._proc.stderr:
            self._log.write(raw)
            with self._cond:
                self._lines.append(raw.decode(errors="replace"))
                self._cond.notify_all()
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def wait_for(self, text: str, deadline: float) -> str | None:
        """Return the first line holding ``text``; None once the output ended or time is up."""
        seen = 0
        with self._cond:
            while True:
                for line in self._lines[seen:]:
                    if text in line:
                        return line
                seen = len(self._lines)
                left = deadline - time.monotonic()
                if self._ended or left <= 0:
                    return None
                self._cond.wait(min(left, 0.2))

    def close(self) -> None:
        self._pump.join(timeout=5)
        self._log.flush()


def run_matrix(
    run: AppRun,
    contract: ProofContract,
    workdir: Path,
    *,
    points: Sequence[str] = SAVEPOINT_POINTS,
    workers: Sequence[int] = (1, 2),
    pace: Sequence[str] = (),
    events: int = 0,
    echo: bool = True,
) -> ChaosVerdict:
    """Run a scenario per point and ``job.workers``, each proven against one reference run."""
    from aiostream_ckpt_dev.validate.proof import reference_run

    verdict = ChaosVerdict()
    reference = workdir / "reference"
    reference_run(run, contract, reference)
    for w in workers:
        for point in points:
            sc = run_scenario(
                run,
                contract,
                reference,
                workdir / f"{point}-w{w}",
                point,
                w,
                verdict=verdict,
                pace=pace,
            )
            verdict.rounds += 1
            if sc.killed:
                verdict.kills += 1
                verdict.windows[f"savepoint:{sc.label}"] += 1
            verdict.events += events * (1 + len(sc.restored))
            verdict.problems += sc.problems
            if echo:
                answered = f"answered {sc.answer['id']}" if sc.answer else "not answered"
                print(
                    f"savepoint kill {sc.label}: {answered}, {len(sc.savepoints)} complete "
                    f"savepoint(s), restored {len(sc.restored)}; "
                    f"{'ok' if not sc.problems else sc.problems[0]}",
                    flush=True,
                )
    return verdict
