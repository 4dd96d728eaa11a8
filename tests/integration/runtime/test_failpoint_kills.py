"""kill -9 at every fail point window leaves exactly-once output.

Each window is hit by plan (``AIOSTREAM_FAILPOINTS``), not by luck: one run of
the worker per window, restarted on the same directories, and the committed
output is then proven against a failure-free reference run and against an
independent recount of the input.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from aiostream_ckpt.failpoints import POINTS, SAVEPOINT_POINTS
from aiostream_ckpt_dev.chaos.cli import run_chaos
from aiostream_ckpt_dev.chaos.windows import (
    DELTA_WINDOWS,
    MAIN_RUNNING,
    UNALIGNED_WINDOWS,
    Kill,
    run_round,
)
from aiostream_ckpt_dev.validate.proof import (
    AppRun,
    compare_dirs,
    compare_oracle,
    load_contract,
    reference_run,
)
from apps import pv_count
from apps import transitions_per_hour as transitions
from tests.helpers import cli_cmd, make_pv_input

pytestmark = pytest.mark.integration

#: Every window once (the Delta sink's: tests/integration/connectors/test_delta_kill9.py;
#: those of unaligned checkpoints: test_kill9_unaligned.py; a triggered savepoint's:
#: tests/integration/daemon/test_savepoint_kill9.py and ``make chaos``). A recovery
#: window is reached only once a checkpoint is durable.
PLAN = [
    Kill("metadata_durable", 2),
    Kill("pre_barrier_flush", 3),
    Kill("restore_begin"),
    Kill("snapshot_write", 2),
    Kill("restore_before_sinks"),
    Kill("sink_commit", 2),
    Kill("restore_after_sinks"),
    Kill("final_metadata_durable"),
    Kill("final_committed"),
]


@pytest.mark.parametrize("parallelism", [1, 2])
def test_a_kill_in_every_window_keeps_pv_count_exact(tmp_path: Path, parallelism: int) -> None:
    windows = set(POINTS) - set(DELTA_WINDOWS) - set(UNALIGNED_WINDOWS) - set(SAVEPOINT_POINTS)
    windows.discard("checkpoint_uploaded")  # checkpoint.dir=s3://: test_kill9_object_storage
    assert {k.window for k in PLAN} == windows
    inputs = [
        make_pv_input(tmp_path / f"in-{i}.jsonl", 150_000, seed=i, keys=50, malformed=1)
        for i in range(parallelism)
    ]
    sets = [
        f"app.input={','.join(map(str, inputs))}",
        f"app.output={tmp_path / 'out'}",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        f"job.parallelism={parallelism}",
        "checkpoint.interval=30ms",
        "job.batch_size=256",
        # paced: a pass >= 1.3 s, 44 checkpoint intervals, on any machine; an idle one
        # read the 80 k events unpaced before the plan's kills came due
        "app.rate=30000",
    ]
    cmd = cli_cmd(
        "run", "apps.pv_count", *[a for s in [*sets, "rest.port=0"] for a in ("--set", s)]
    )
    log = tmp_path / "worker.log"
    result = run_round(cmd, PLAN, inputs=inputs, log_path=log, timeout=600)
    assert result.exit_code == 0, log.read_text()[-3000:]
    assert dict(result.kills) == dict.fromkeys(windows, 1), (result.kills, result.missed)
    for w in windows:
        assert f"failpoint {w}: SIGKILL" in log.read_text()

    run = AppRun("apps.pv_count", sets)
    reference_run(run, pv_count.PROOF, tmp_path / "ref")
    proof = compare_dirs(tmp_path / "out", tmp_path / "ref" / "out-output", pv_count.PROOF)
    assert proof.passed, (proof.counts, proof.examples)
    assert proof.counts["records_out"] == 150_000 * parallelism
    dead = compare_dirs(
        tmp_path / "ckpt" / "dead-letter" / "events",
        tmp_path / "ref" / "dead-letter" / "events",
        pv_count.PROOF,
    )
    assert dead.passed and dead.counts["records_out"] == parallelism, dead.counts
    assert pv_count.PROOF.oracle is not None
    recount = compare_oracle(
        tmp_path / "out", pv_count.PROOF.oracle({"input": sets[0][10:]}), pv_count.PROOF
    )
    assert recount.passed, recount.counts


def test_chaos_command_on_the_windowed_app_at_parallelism_2(tmp_path: Path) -> None:
    inputs = []
    for i in range(2):
        events = transitions.generate_events(
            40_000, users=30, max_delay=120_000, seed=20 + i, step_ms=2_000
        )
        events = [{**e, "user_id": f"{e['user_id']}-{i}"} for e in events]
        inputs.append(transitions.write_events(tmp_path / f"in-{i}.jsonl", events))
    run = AppRun(
        "apps.transitions_per_hour",
        [
            f"app.input={','.join(map(str, inputs))}",
            f"app.output={tmp_path / 'unused'}",
            "app.max_delay=120000",
            "job.parallelism=2",
            "checkpoint.interval=30ms",
            "job.batch_size=256",
        ],
    )
    verdict = run_chaos(
        run,
        load_contract(run.module),
        kills=5,
        seed=random.Random(7).randrange(1000),
        workdir=tmp_path / "chaos",
        kills_per_round=5,
        oracle=True,
        echo=False,
    )
    assert verdict.passed, verdict.problems
    assert verdict.kills >= 5 and verdict.events == 80_000
    want = f"chaos: kills={verdict.kills} faults=0 events=80000 lost=0 duplicated=0 verdict=PASS"
    assert verdict.line() == want


def test_at_two_workers_a_task_window_kills_a_worker_then_the_main_process(
    tmp_path: Path,
) -> None:
    """chaos.windows at job.workers=2: the harness behind the suite's workers parts.

    A task's fail point (and a position kill aimed at a worker) kills a worker
    of the run's first attempt; the restarted attempt checkpoints, then the
    main process is killed; the coordinator's point kills the main process.
    """
    inputs = [make_pv_input(tmp_path / f"in-{i}.jsonl", 40_000, seed=30 + i) for i in range(2)]
    sets = [
        f"app.input={','.join(map(str, inputs))}",
        f"app.output={tmp_path / 'out'}",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "job.parallelism=2",
        "job.workers=2",
        "restart.delay=0s",
        "checkpoint.interval=30ms",
        "job.batch_size=256",
        # paced: a pass >= 1.3 s, 44 checkpoint intervals, on any machine; an idle one
        # read the 80 k events unpaced before the plan's kills came due
        "app.rate=30000",
    ]
    cmd = cli_cmd(
        "run", "apps.pv_count", *[a for s in [*sets, "rest.port=0"] for a in ("--set", s)]
    )
    plan = [
        Kill("metadata_durable", 2),
        Kill("sink_commit", 2, after=0.1),
        Kill("position", fraction=0.05, worker=1),
    ]
    log = tmp_path / "worker.log"
    result = run_round(cmd, plan, inputs=inputs, log_path=log, timeout=600, workers=2)
    text = log.read_text()
    assert result.exit_code == 0, text[-3000:]
    assert result.kills["metadata_durable"] == 1 and result.kills["worker:sink_commit"] == 1, (
        result.kills
    )
    assert result.kills["worker:position"] <= 1 and result.kills[MAIN_RUNNING] >= 1, result.kills
    assert text.count("failpoint sink_commit: SIGKILL at hit 2") in (1, 2)  # both may reach it
    assert pv_count.PROOF.oracle is not None
    recount = compare_oracle(
        tmp_path / "out", pv_count.PROOF.oracle({"input": sets[0][10:]}), pv_count.PROOF
    )
    assert recount.passed and recount.counts["records_out"] == 80_000, recount.counts
