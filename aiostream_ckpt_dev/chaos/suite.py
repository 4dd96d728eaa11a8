"""``make chaos``: the project's own chaos suite, ≥ 100 kill -9 across the dangerous windows.

Runs :func:`aiostream_ckpt_dev.chaos.cli.run_chaos` over pv_count and the
windowed transitions_per_hour app, at parallelism 1 and 2, with kills at
every fail point window (snapshot write, metadata durable, sink commit,
recovery, end of input) and by input position. Two parts run at
``job.workers=2``: the windows of tasks kill a worker process, the
coordinator's the main one, a position kill either, and every worker's kill
is followed by one of the main process once the restarted attempt
checkpointed (``chaos.windows``); a third part there SIGSTOPs a worker
instead (a hung worker, caught by its heartbeats: ``job.heartbeat_timeout``)
before the main process's kill. Three parts run with unaligned checkpoints
(``checkpoint.unaligned=true``, pv_count behind a slow step so that barriers
overtake full channels; at one and two workers), their two windows among the
kills (``--unaligned`` runs only those). Each round's output is proven
against a failure-free reference run and against the app's own recount of
the input (``PROOF.oracle``), read by the proof's file reader: no code is
shared with the sink being checked. A last pv_count part also injects the
faults of :mod:`.faults` between its restarts (two successors at once,
a corrupt newest checkpoint); its proof reads the committed output a reader
sees, not what a fallback moved aside. Two pv_count parts write a Delta
table (``app.sink=delta``), with the Delta sink's windows in their plans
(data files written at a barrier, before and after the Delta commit), one of
them with the faults (a fallback then retracts by a Delta commit); their
proof reads the table's newest version through delta-rs. Two last parts kill
pv_count (its file sink, then its Delta sink) at every point of a triggered
savepoint's path, at ``job.workers`` 1 and 2, and prove the output after the
restart and again after a restore of the savepoint into a fresh checkpoint
directory (:mod:`.savepoint_kills`).
Prints one verdict line::

    chaos: kills=N faults=F events=E lost=L duplicated=D verdict=PASS|FAIL

Not part of ``make test`` (several minutes). ``--kills`` scales the parts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiostream_ckpt.connectors.generator import write_generated_jsonl
from aiostream_ckpt_dev.chaos.cli import ChaosVerdict, run_chaos
from aiostream_ckpt_dev.chaos.savepoint_kills import run_matrix
from aiostream_ckpt_dev.validate.proof import AppRun, load_contract


@dataclass(frozen=True)
class Part:
    app: str
    parallelism: int
    share: float  # of the kills
    make_inputs: Callable[[Path, int], list[Path]]
    sets: tuple[str, ...] = ()
    faults: bool = False  # inject chaos.faults between the restarts
    workers: int = 1  # job.workers
    hangs: bool = False  # SIGSTOP a worker between the first and the end-of-input kills
    delta: bool = False  # into a Delta table (app.sink=delta): its windows join the plan


def _pv_inputs(d: Path, parallelism: int) -> list[Path]:
    paths = []
    for i in range(parallelism):
        p = d / f"pv-{parallelism}-{i}.jsonl"
        write_generated_jsonl(p, 300_000 // parallelism, seed=11 + i, keys=500)
        paths.append(p)
    with open(paths[0], "ab") as f:  # dead letters are output too
        f.write(b'{"app_id": broken\n["not", "an", "object"]\n{"app_id": 7}\n')
    return paths


def _transitions_inputs(d: Path, parallelism: int) -> list[Path]:
    from apps import transitions_per_hour as app

    paths = []
    for i in range(parallelism):
        events = app.generate_events(
            60_000 // parallelism, users=40, max_delay=120_000, seed=31 + i, step_ms=2_000
        )
        # a user's events come from one input: with two, the later file may not hold them back
        events = [{**e, "user_id": f"{e['user_id']}-{i}"} for e in events]
        paths.append(app.write_events(d / f"tr-{parallelism}-{i}.jsonl", events))
    return paths


_MODULE = "aiostream_ckpt_dev.chaos.suite"  # __name__ is __main__ under -m
_WORKERS = ("job.workers=2", "restart.delay=100ms")
#: a hung worker is seen in 5 s, not the default 20 (a loaded machine's loop may stall 1-2 s)
_HEARTBEATS = ("job.heartbeat_interval=200ms", "job.heartbeat_timeout=5s")
_UNALIGNED = ("checkpoint.unaligned=true",)
#: a slow keyed map_async step (1 ms a call, 32 at once a subtask): full channels
_SLOW = ("app.slow_ms=1",)

PARTS = (
    Part("apps.pv_count", 1, 0.35, _pv_inputs),
    Part("apps.pv_count", 2, 0.25, _pv_inputs),
    Part("apps.transitions_per_hour", 1, 0.22, _transitions_inputs, ("app.max_delay=120000",)),
    Part("apps.transitions_per_hour", 2, 0.18, _transitions_inputs, ("app.max_delay=120000",)),
    # kills on top of the shares above (which add up to 1): 3 rounds, 2 faults each
    Part("apps.pv_count", 1, 0.23, _pv_inputs, faults=True),
    # and in worker processes (a worker's kill counts with the main process's after it)
    Part("apps.pv_count", 2, 0.3, _pv_inputs, _WORKERS, workers=2),
    Part(
        "apps.transitions_per_hour",
        2,
        0.2,
        _transitions_inputs,
        ("app.max_delay=120000", *_WORKERS),
        workers=2,
    ),
    # hung workers (SIGSTOP), each caught by its heartbeats, then the main process's kill
    Part("apps.pv_count", 2, 0.1, _pv_inputs, (*_WORKERS, *_HEARTBEATS), workers=2, hangs=True),
    # into a Delta table: its windows too; with faults, a fallback retracts by a Delta commit
    Part("apps.pv_count", 2, 0.2, _pv_inputs, ("app.sink=delta",), delta=True),
    Part("apps.pv_count", 1, 0.1, _pv_inputs, ("app.sink=delta",), faults=True, delta=True),
    # unaligned checkpoints, their windows among the kills: in one process and in two
    # workers, pv_count behind a slow step so that barriers overtake full channels
    Part("apps.pv_count", 2, 0.2, _pv_inputs, (*_UNALIGNED, *_SLOW)),
    Part("apps.pv_count", 2, 0.2, _pv_inputs, (*_UNALIGNED, *_SLOW, *_WORKERS), workers=2),
    Part(
        "apps.transitions_per_hour",
        2,
        0.15,
        _transitions_inputs,
        ("app.max_delay=120000", *_UNALIGNED, *_WORKERS),
        workers=2,
    ),
)


#: The parts after :data:`PARTS`: a kill at each point of a savepoint's path (a fixed
#: count), with pv_count's file sink, then with its Delta sink.
SAVEPOINT_PARTS = {len(PARTS): "files", len(PARTS) + 1: "delta"}
_SAVEPOINT_EVENTS = 30_000  # per input, two inputs: paced, the savepoint comes mid-way


def run_savepoint_part(n: int, workdir: Path, *, keep: bool = False) -> ChaosVerdict:
    """Run :func:`~.savepoint_kills.run_matrix` on pv_count (see the module docstring)."""
    sink = SAVEPOINT_PARTS[n]
    d = workdir / f"{n}-savepoints-{sink}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    inputs = []
    for i in range(2):
        p = d / f"pv-{i}.jsonl"
        write_generated_jsonl(p, _SAVEPOINT_EVENTS, seed=41 + i, keys=300)
        inputs.append(p)
    with open(inputs[0], "ab") as f:  # a dead letter: that output is held and proven too
        f.write(b'{"app_id": broken\n')
    run = AppRun(
        "apps.pv_count",
        [
            f"app.input={','.join(str(p) for p in inputs)}",
            f"app.output={d / 'output'}",
            "job.parallelism=2",
            "checkpoint.interval=100ms",
            "job.batch_size=256",
            f"app.sink={sink}",
        ],
    )
    started = time.monotonic()
    print(
        f"chaos suite: apps.pv_count ({sink} sink), a kill at each point of a savepoint's path",
        flush=True,
    )
    verdict = run_matrix(
        run,
        load_contract("apps.pv_count"),
        d,
        pace=["app.rate=10000"],
        events=2 * _SAVEPOINT_EVENTS + 1,
    )
    print(f"  {verdict.details()}", flush=True)
    print(f"  {verdict.line()} ({time.monotonic() - started:.0f}s)", flush=True)
    if not keep and verdict.passed:
        shutil.rmtree(d, ignore_errors=True)
    return verdict


def run_part(n: int, kills: int, seed: int, workdir: Path, *, keep: bool = False) -> ChaosVerdict:
    """Run part ``n`` of :data:`PARTS` (its share of ``kills``) under ``workdir``."""
    if n in SAVEPOINT_PARTS:
        return run_savepoint_part(n, workdir, keep=keep)
    part = PARTS[n]
    d = workdir / f"{n}-{part.app.rsplit('.', 1)[-1]}-p{part.parallelism}-w{part.workers}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    inputs = part.make_inputs(d, part.parallelism)
    run = AppRun(
        part.app,
        [
            f"app.input={','.join(str(p) for p in inputs)}",
            f"app.output={d / 'output'}",
            f"job.parallelism={part.parallelism}",
            "checkpoint.interval=50ms",
            "job.batch_size=256",
            *part.sets,
        ],
    )
    want = max(1, round(kills * part.share))
    started = time.monotonic()
    faults = ", faults" if part.faults else ""
    workers = f", {part.workers} workers" if part.workers > 1 else ""
    workers += ", hung workers" if part.hangs else ""
    workers += ", into a Delta table" if part.delta else ""
    print(
        f"chaos suite: {part.app} parallelism {part.parallelism}{workers}, {want} kills{faults}",
        flush=True,
    )
    verdict = run_chaos(
        run,
        load_contract(part.app),
        kills=want,
        seed=seed + n,
        workdir=d / "chaos",
        oracle=True,
        keep=keep,
        faults=part.faults,
        hangs=part.hangs,
        delta=part.delta,
    )
    print(f"  {verdict.details()}", flush=True)
    print(f"  {verdict.line()} ({time.monotonic() - started:.0f}s)", flush=True)
    if not keep and verdict.passed:  # a failed part keeps its logs and output
        shutil.rmtree(d, ignore_errors=True)
    return verdict


def unaligned_parts() -> list[int]:
    """Return the parts with ``checkpoint.unaligned=true`` (``--unaligned``)."""
    return [n for n, part in enumerate(PARTS) if _UNALIGNED[0] in part.sets]


def run_suite(
    kills: int,
    seed: int,
    workdir: Path,
    *,
    jobs: int = 2,
    keep: bool = False,
    parts: list[int] | None = None,
) -> ChaosVerdict:
    """Run every part (or ``parts``), ``jobs`` at a time, each in its own process; add them up.

    A part's worker runs mostly one core, so two parts at once use a 2-core
    machine; a process per part keeps their embedded reference runs apart.
    """
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    # the savepoint parts last
    todo = list(range(len(PARTS) + len(SAVEPOINT_PARTS))) if parts is None else list(parts)
    running: dict[int, subprocess.Popen[bytes]] = {}
    total = ChaosVerdict()
    while todo or running:
        while todo and len(running) < max(1, jobs):
            n = todo.pop(0)
            argv = [sys.executable, "-m", _MODULE, "--part", str(n), "--kills", str(kills)]
            argv += ["--seed", str(seed), "--workdir", str(workdir)] + (["--keep"] if keep else [])
            with open(workdir / f"part-{n}.log", "wb") as log:
                running[n] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(0.5)
        for n, proc in list(running.items()):
            if proc.poll() is None:
                continue
            del running[n]
            print((workdir / f"part-{n}.log").read_text().rstrip(), flush=True)
            total.add(_load(workdir / f"part-{n}.json", f"part {n} exited {proc.returncode}"))
    return total


def _save(verdict: ChaosVerdict, path: Path) -> None:
    v = verdict
    fields = {"kills": v.kills, "events": v.events, "rounds": v.rounds, "problems": v.problems}
    fields["retracted"] = v.retracted
    fields["assumptions"] = v.assumptions
    counters = {"counts": v.counts, "windows": v.windows, "faults": v.faults}
    path.write_text(json.dumps({**fields, **counters}))


def _load(path: Path, missing: str) -> ChaosVerdict:
    if not path.is_file():
        return ChaosVerdict(problems=[f"{missing} without a verdict"])
    raw = json.loads(path.read_text())
    return ChaosVerdict(
        kills=raw["kills"],
        events=raw["events"],
        rounds=raw["rounds"],
        counts=Counter(raw["counts"]),
        windows=Counter(raw["windows"]),
        faults=Counter(raw["faults"]),
        retracted=raw["retracted"],
        problems=raw["problems"],
        assumptions=raw.get("assumptions", []),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make chaos", description=__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=104)
    p.add_argument("--seed", type=int, default=None, help="default: random")
    p.add_argument("--workdir", type=Path, default=Path(".chaos-suite"))
    p.add_argument("--jobs", type=int, default=2, help="parts run at once (default 2)")
    p.add_argument("--keep", action="store_true", help="keep inputs and every round's output")
    p.add_argument(
        "--unaligned",
        action="store_true",
        help="only the parts with checkpoint.unaligned=true (their share of --kills)",
    )
    p.add_argument("--part", type=int, help=argparse.SUPPRESS)  # one part, in a child
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    workdir = args.workdir.resolve()
    if args.part is not None:
        verdict = run_part(args.part, args.kills, seed, workdir, keep=args.keep)
        _save(verdict, workdir / f"part-{args.part}.json")
        return 0 if verdict.passed else 1
    started = time.monotonic()
    print(f"chaos suite: seed {seed}", flush=True)
    parts = unaligned_parts() if args.unaligned else None
    verdict = run_suite(args.kills, seed, workdir, jobs=args.jobs, keep=args.keep, parts=parts)
    for problem in verdict.problems:
        print(f"chaos: problem: {problem}")
    print(verdict.details() + f"; {time.monotonic() - started:.0f}s")
    for a in verdict.assumptions:
        print(f"chaos: assumes: {a}")
    print(verdict.line(), flush=True)
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
