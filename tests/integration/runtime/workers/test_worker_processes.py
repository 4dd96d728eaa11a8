"""Worker processes: each builds the job itself, says hello, and never outlives the main one."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from aiostream_ckpt.api.environment import StreamEnvironment
from aiostream_ckpt.daemon.app_loader import build_app
from aiostream_ckpt.daemon.config import load_config
from aiostream_ckpt.errors import ChannelError, WorkerError
from aiostream_ckpt.runtime.graph import plan_chains
from aiostream_ckpt.runtime.network.placement import graph_fingerprint, worker_tasks
from aiostream_ckpt.runtime.workers.worker_process import WorkerLaunch, WorkerProcess, WorkerState
from tests.helpers import gone

pytestmark = pytest.mark.integration


def main_side(tmp_path: Path, sets: list[str]) -> tuple[str, list[tuple[str, int]]]:
    """Build pv_count in this process, as the main process does: its fingerprint and chains."""
    loaded = load_config(None, env={}, sets=sets)
    env = StreamEnvironment("pv_count", config=loaded.job, params=loaded.params)
    build_app("apps.pv_count", env)
    spec = env.spec()
    chains = plan_chains(spec.transformations, spec.config)
    return graph_fingerprint(spec.transformations), [(c.head.uid, c.parallelism) for c in chains]


def pv_sets(tmp_path: Path, parallelism: int = 2) -> list[str]:
    return [
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        f"job.parallelism={parallelism}",
        "app.generate=1000",
        f"app.output={tmp_path / 'out'}",
    ]


async def test_workers_build_the_same_job_and_take_their_share(tmp_path: Path) -> None:
    sets = pv_sets(tmp_path)
    fingerprint, chains = main_side(tmp_path, sets)
    launch = WorkerLaunch("apps.pv_count", None, tuple(sets), workers=2)
    workers = [WorkerProcess(i, launch) for i in range(2)]
    shares = [worker_tasks(chains, i, 2) for i in range(2)]
    await asyncio.gather(*(w.start(fingerprint, s) for w, s in zip(workers, shares, strict=True)))
    assert [w.state for w in workers] == [WorkerState.READY] * 2
    assert [w.hello["tasks"] for w in workers] == shares
    assert shares[0] and shares[1] and not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == sorted(
        f"{head}-{sub}" for head, p in chains for sub in range(p)
    )
    assert [w.hello["pid"] for w in workers] == [w.pid for w in workers]
    assert [await w.stop() for w in workers] == [0, 0]
    assert [w.state for w in workers] == [WorkerState.STOPPED] * 2


async def test_a_worker_that_builds_another_graph_is_refused(tmp_path: Path) -> None:
    fingerprint, chains = main_side(tmp_path, pv_sets(tmp_path, parallelism=2))
    # the worker's config differs (as an app whose graph depends on the host would)
    launch = WorkerLaunch("apps.pv_count", None, tuple(pv_sets(tmp_path, 3)), workers=2)
    worker = WorkerProcess(0, launch)
    with pytest.raises(WorkerError, match=r"built a different job from 'apps\.pv_count'"):
        await worker.start(fingerprint, worker_tasks(chains, 0, 2))
    assert worker.state is WorkerState.FAILED


async def test_a_worker_that_cannot_build_the_job_says_why(tmp_path: Path) -> None:
    launch = WorkerLaunch("apps.no_such_app", None, tuple(pv_sets(tmp_path)), workers=1)
    worker = WorkerProcess(0, launch)
    with pytest.raises(WorkerError, match="could not build the job: cannot import app module"):
        await worker.start("x", [])


async def test_a_killed_worker_is_the_control_connection_failure(tmp_path: Path) -> None:
    sets = pv_sets(tmp_path)
    fingerprint, chains = main_side(tmp_path, sets)
    launch = WorkerLaunch("apps.pv_count", None, tuple(sets), workers=2)
    worker = WorkerProcess(1, launch)
    await worker.start(fingerprint, worker_tasks(chains, 1, 2))
    assert worker.pid is not None
    os.kill(worker.pid, signal.SIGKILL)
    exc = await asyncio.wait_for(worker.failure, 60)
    assert isinstance(exc, ChannelError) and "peer process is gone" in str(exc)
    assert await worker.stop() == -signal.SIGKILL
    assert worker.state is WorkerState.FAILED


#: a main process: starts one worker for pv_count, prints its pid, waits to be killed
MAIN = textwrap.dedent(
    """
    import asyncio, sys
    from aiostream_ckpt.api.environment import StreamEnvironment
    from aiostream_ckpt.daemon.app_loader import build_app
    from aiostream_ckpt.daemon.config import load_config
    from aiostream_ckpt.runtime.graph import plan_chains
    from aiostream_ckpt.runtime.network.placement import graph_fingerprint, worker_tasks
    from aiostream_ckpt.runtime.workers.worker_process import WorkerLaunch, WorkerProcess

    async def main() -> None:
        sets = tuple(sys.argv[1:])
        loaded = load_config(None, env={}, sets=sets)
        env = StreamEnvironment("pv_count", config=loaded.job, params=loaded.params)
        build_app("apps.pv_count", env)
        spec = env.spec()
        planned = plan_chains(spec.transformations, spec.config)
        chains = [(c.head.uid, c.parallelism) for c in planned]
        worker = WorkerProcess(0, WorkerLaunch("apps.pv_count", None, sets, workers=1))
        await worker.start(graph_fingerprint(spec.transformations), worker_tasks(chains, 0, 1))
        print(worker.pid, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


def kill_parent_and_wait_for_child(argv: list[str]) -> None:
    """Start ``argv`` (it prints its child's pid), kill -9 it, then wait for the child to end."""
    parent = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert not gone(child_pid)  # started and serving
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 60
    while not gone(child_pid):
        assert time.monotonic() < deadline, f"process {child_pid} outlived its parent"
        time.sleep(0.05)  # polling a process we do not own: /proc is the only way to see it


def test_a_worker_dies_with_the_main_process(tmp_path: Path) -> None:
    """kill -9 of the main process leaves no worker behind (PR_SET_PDEATHSIG)."""
    kill_parent_and_wait_for_child([sys.executable, "-c", MAIN, *pv_sets(tmp_path)])


#: a parent whose child asks for PR_SET_PDEATHSIG, then sleeps without any socket to notice
#: the parent's death: only the kernel's signal can end it
PARENT = textwrap.dedent(
    """
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE)
    print(child.stdout.readline().decode().strip(), flush=True)
    child.wait()
    """
)
BUSY_CHILD = textwrap.dedent(
    """
    import os, time
    from aiostream_ckpt.runtime.workers.worker_process import die_with_parent
    die_with_parent(os.getppid())
    print(os.getpid(), flush=True)
    time.sleep(600)
    """
)


def test_die_with_parent_ends_a_busy_worker() -> None:
    kill_parent_and_wait_for_child([sys.executable, "-c", PARENT, BUSY_CHILD])
