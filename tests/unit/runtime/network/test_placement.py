"""Placement: every subtask in exactly one worker; forward neighbours together; one graph digest."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiostream_ckpt.api.environment import StreamEnvironment
from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.jobspec.graph import JobSpec
from aiostream_ckpt.runtime.graph import plan_chains
from aiostream_ckpt.runtime.job import JobRunner, place_workers
from aiostream_ckpt.runtime.network.placement import graph_fingerprint, worker_of, worker_tasks
from aiostream_ckpt.runtime.workers.worker_process import WorkerLaunch


def spec(parallelism: int, uid: str = "count") -> JobSpec:
    env = StreamEnvironment("j", config=JobConfig(parallelism=parallelism))
    env.from_collection([{"k": 1}], uid="src").key_by(lambda r: r["k"]).map(
        lambda r: r, uid=uid
    ).print()
    return env.spec()


def test_every_subtask_runs_in_exactly_one_worker() -> None:
    chains = [("src", 3), ("count", 4)]
    shares = [worker_tasks(chains, w, 2) for w in range(2)]
    assert shares == [["src-0", "src-2", "count-0", "count-2"], ["src-1", "count-1", "count-3"]]
    # subtask i of every chain is in the same worker: forward edges never cross
    assert all(worker_of(i, 3) == i % 3 for i in range(9))
    assert worker_tasks(chains, 0, 1) == [
        "src-0",
        "src-1",
        "src-2",
        "count-0",
        "count-1",
        "count-2",
        "count-3",
    ]


def test_the_fingerprint_is_the_graph_not_the_objects() -> None:
    a, b = spec(2), spec(2)
    assert graph_fingerprint(a.transformations) == graph_fingerprint(b.transformations)
    assert graph_fingerprint(spec(3).transformations) != graph_fingerprint(a.transformations)
    assert graph_fingerprint(spec(2, "other").transformations) != graph_fingerprint(
        a.transformations
    )


def workers_spec(tmp_path: Path, parallelism: int, workers: int) -> JobSpec:
    config = JobConfig(parallelism=parallelism, workers=workers).with_checkpoint_dir(tmp_path)
    env = StreamEnvironment("j", config=config)
    env.from_collection([{"k": 1}], uid="src").print()
    return env.spec()


def test_workers_need_the_app_module(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"job\.workers=2 needs the job run from its app module"):
        JobRunner(workers_spec(tmp_path, 2, 2))


def test_a_parallelism_1_job_is_placed_in_worker_0_not_refused() -> None:
    launch = WorkerLaunch("apps.x", None, (), workers=2)
    wide = plan_chains(spec(2).transformations, JobConfig(parallelism=2))
    assert place_workers(launch, wide) is launch
    narrow = plan_chains(spec(1).transformations, JobConfig(parallelism=1))
    placed = place_workers(launch, narrow)
    assert placed.workers == 1  # worker 1 would have no subtask: it is not started
    # the whole job, one chain at parallelism 1, runs in worker 0
    assert worker_tasks([(c.head.uid, c.parallelism) for c in narrow], 0, placed.workers) == [
        "src-0"
    ]
