"""job.workers=2: worker processes run the job's subtasks, the main process coordinates.

Real processes throughout (``aiostream-ckpt run``, its workers, kill -9); the
output is checked against a recount of the input, key by key.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from aiostream_ckpt.checkpoint.storage import CheckpointStorage
from aiostream_ckpt_dev.chaos.kills import read_fraction
from tests.helpers import (
    REPO,
    check_pv_output,
    cli,
    cli_cmd,
    make_pv_input,
    recount,
    run_app_under_kills,
)

pytestmark = pytest.mark.integration

_STARTED = re.compile(r"worker (\d+) started \(pid (\d+)\)")


def pv_args(tmp: Path, inputs: list[Path], workers: int, *extra: str) -> list[str]:
    return [
        "run", "apps.pv_count",
        "--set", f"checkpoint.dir={tmp / 'ckpt'}",
        "--set", f"app.input={','.join(map(str, inputs))}",
        "--set", f"app.output={tmp / 'out'}",
        "--set", "job.parallelism=2",
        "--set", f"job.workers={workers}",
        "--set", "job.batch_size=512",
        "--set", "checkpoint.interval=50ms",
        "--set", "restart.delay=0s",
        *extra,
    ]  # fmt: skip


def worker_pids(log: str) -> dict[int, list[int]]:
    """Return the pids each worker index had, attempt after attempt, from the job's log."""
    pids: dict[int, list[int]] = {}
    for index, pid in _STARTED.findall(log):
        pids.setdefault(int(index), []).append(int(pid))
    return pids


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live worker process (not gone, not a zombie being reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return state != "Z" and b"aiostream_ckpt.daemon.worker" in cmdline


@dataclass
class Run:
    tmp: Path
    inputs: list[Path]
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Run]:
    """pv_count over the same two files, once in one process and once in two workers."""
    base = tmp_path_factory.mktemp("workers")
    inputs = [
        make_pv_input(base / f"in-{i}.jsonl", 10_000, seed=40 + i, keys=300, malformed=2)
        for i in range(2)
    ]
    out = {}
    for workers in (1, 2):
        tmp = base / f"w{workers}"
        tmp.mkdir()
        result = cli(*pv_args(tmp, inputs, workers), timeout=120)
        assert result.returncode == 0, result.stderr[-4000:]
        out[workers] = Run(tmp, inputs, result)
    return out


def test_two_workers_commit_exactly_what_one_process_commits(runs: dict[int, Run]) -> None:
    expected = recount(*runs[1].inputs)
    one = check_pv_output(runs[1].tmp / "out", expected)
    two = check_pv_output(runs[2].tmp / "out", expected)
    assert one.exact and two.exact, (two.duplicates, two.missing, two.gaps[:5])
    assert two.records == one.records == sum(expected.values())
    assert two.final == one.final == dict(expected)
    # the work was done in the workers, one per share
    assert sorted(worker_pids(runs[2].result.stderr)) == [0, 1]
    assert not worker_pids(runs[1].result.stderr)


def test_a_checkpoint_completes_with_every_subtask_of_both_workers(runs: dict[int, Run]) -> None:
    storage = CheckpointStorage(runs[2].tmp / "ckpt", create=False)
    latest = storage.latest_valid()
    assert latest is not None and latest.is_final
    # subtask i ran in worker i % 2: both workers acknowledged, each with its state
    assert set(latest.tasks) == {"events-0", "events-1", "pv-count-0", "pv-count-1"}
    for uid in ("events", "pv-count", "pv-sink"):
        assert set(latest.subtask_states(uid)) == {0, 1}, uid
    for sub, st in latest.subtask_states("pv-count").items():
        assert st["keyed"] is not None, sub  # the worker's LMDB snapshot, in the shared storage
    for sub, st in latest.subtask_states("events").items():
        assert st["operator"]["positions"], sub  # the source's file offset, from its worker


def _lines(proc: subprocess.Popen[str], into: list[str]) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        into.append(line)


def test_kill9_of_a_worker_restarts_every_worker_from_the_checkpoint(tmp_path: Path) -> None:
    inputs = [make_pv_input(tmp_path / f"in-{i}.jsonl", 60_000, seed=7 + i) for i in range(2)]
    sizes = {str(p.resolve()): p.stat().st_size for p in inputs}
    proc = subprocess.Popen(
        cli_cmd(*pv_args(tmp_path, inputs, 2)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    lines: list[str] = []
    reader = threading.Thread(target=_lines, args=(proc, lines), daemon=True)
    reader.start()
    victim = None
    try:
        deadline = time.monotonic() + 120
        while victim is None and proc.poll() is None and time.monotonic() < deadline:
            log = "".join(lines)
            pids = worker_pids(log)
            # kill worker 1 once a checkpoint completed and it read a third of its file
            checkpointed = "checkpoint 1 completed" in log
            if 1 in pids and checkpointed and read_fraction(pids[1][0], sizes) >= 0.3:
                victim = pids[1][0]
                os.kill(victim, signal.SIGKILL)
            time.sleep(0.005)  # polling the kill condition, not waiting for time
        assert victim is not None, "".join(lines)[-3000:]
        assert proc.wait(timeout=120) == 0, "".join(lines)[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
    log = "".join(lines)
    assert "peer process is gone" in log and "restart 1" in log, log[-3000:]
    pids = worker_pids(log)
    assert len(pids[0]) == len(pids[1]) == 2  # the surviving worker was restarted too
    assert not any(alive(p) for ps in pids.values() for p in ps)
    check = check_pv_output(tmp_path / "out", recount(*inputs))
    assert check.exact, (check.duplicates, check.missing, check.gaps[:5])


def test_kill9_of_the_main_process_leaves_no_worker_and_a_rerun_recovers(
    tmp_path: Path,
) -> None:
    inputs = [make_pv_input(tmp_path / f"in-{i}.jsonl", 60_000, seed=3 + i) for i in range(2)]
    out = tmp_path / "out"
    _, log_path = run_app_under_kills(
        tmp_path,
        "apps.pv_count",
        [
            f"app.input={','.join(map(str, inputs))}",
            f"app.output={out}",
            "job.workers=2",
            "restart.delay=0s",
        ],
        kills=1,
        seed=11,
        inputs=inputs,  # by how far the workers read (the main process reads nothing)
        parallelism=2,
        timeout=120,
    )
    log = log_path.read_text()
    pids = worker_pids(log)
    assert len(pids[0]) == len(pids[1]) == 2, log[-3000:]  # one attempt per run
    # the killed run's workers died with it (PR_SET_PDEATHSIG), the re-run's ended with it
    assert not any(alive(p) for ps in pids.values() for p in ps)
    check = check_pv_output(out, recount(*inputs))
    assert check.exact, (check.duplicates, check.missing, check.gaps[:5])
