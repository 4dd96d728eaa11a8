"""The workers of ``aiostream-ckpt run`` start before the main process builds the job.

A worker's start (interpreter, imports, building the job from the app module)
cost as much CPU as the main process's, and began only once the main process
had imported the runtime, built the job and planned it: ~0.35 of its 0.4 CPU s
before the first worker existed, one start after the other. Now the main
process starts them right after reading its config (``runtime.workers.worker_process.EarlyWorkers``)
and builds the job while they build theirs; the first attempt takes them, or
kills them if it runs fewer (``job.place_workers``).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from aiostream_ckpt.runtime.workers.worker_process import EarlyWorkers, WorkerLaunch, WorkerState
from tests.helpers import REPO

#: the main process, stopped where it starts its first worker: what has it built by then?
SPAWN = """
import asyncio, os, sys
from aiostream_ckpt.daemon.cli import main

async def spawn(*args, **kwargs):
    loaded = ("apps.pv_count", "aiostream_ckpt.api", "urllib.request", "prometheus_client")
    print(sorted(m for m in loaded if m in sys.modules))
    sys.stdout.flush()
    os._exit(0)

asyncio.create_subprocess_exec = spawn
sys.exit(main(sys.argv[1:]))
"""

#: a Kafka job: its workers build it and say hello without a broker (none is reached)
KAFKA_SETS = (
    "app.kafka_bootstrap=127.0.0.1:9",
    "app.input_topic=in",
    "app.output_topic=out",
    "job.parallelism=2",
    "job.workers=2",
    "rest.enabled=false",
)


def test_the_workers_start_before_the_main_process_builds_the_job(tmp_path: Path) -> None:
    args = ["run", "apps.pv_count", "--set", f"checkpoint.dir={tmp_path / 'ckpt'}"]
    for s in KAFKA_SETS:
        args += ["--set", s]
    r = subprocess.run(
        [sys.executable, "-c", SPAWN, *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # not the app, nor the API building it, nor what only the main process's own work
    # needs (its metrics; the REST client commands' HTTP client)
    assert r.stdout.strip() == "[]", r.stderr[-2000:]


async def test_early_workers_go_to_the_first_attempt_once_or_are_killed(tmp_path: Path) -> None:
    sets = (f"checkpoint.dir={tmp_path / 'ckpt'}", *KAFKA_SETS)
    launch = WorkerLaunch("apps.pv_count", None, sets, 2)
    early = EarlyWorkers(launch)
    await early.spawn()
    taken = await early.take(launch)
    assert taken is not None and [w.index for w in taken] == [0, 1]
    assert await early.take(launch) is None  # once: a restarted attempt starts its own
    for w in taken:
        await w.kill()

    # the job runs fewer workers than were started (its widest operator): none is kept
    early = EarlyWorkers(launch)
    await early.spawn()
    workers = list(early._workers)
    assert await early.take(WorkerLaunch("apps.pv_count", None, sets, 1)) is None
    for w in workers:
        assert w.state is WorkerState.FAILED
        await asyncio.wait_for(w.exited(), 30)

    # nobody took them (the job failed to build, or was refused): close() kills them
    early = EarlyWorkers(launch)
    await early.spawn()
    workers = list(early._workers)
    await early.close()
    for w in workers:
        await asyncio.wait_for(w.exited(), 30)


def test_a_job_that_fails_to_build_kills_its_early_workers_and_names_the_cause(
    tmp_path: Path,
) -> None:
    """The workers started before the build are killed quietly: the cause stays the last line."""
    args = ["run", "apps.pv_count", "--set", f"checkpoint.dir={tmp_path / 'ckpt'}"]
    for s in KAFKA_SETS:
        if not s.startswith("app.output_topic"):
            args += ["--set", s]
    r = subprocess.run(
        [sys.executable, "-m", "aiostream_ckpt.daemon.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.endswith("build(env) failed: ValueError: Kafka mode: set app.output_topic"), last
