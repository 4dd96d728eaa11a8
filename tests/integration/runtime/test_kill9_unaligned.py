"""kill -9 with unaligned checkpoints (``checkpoint.unaligned=true``) leaves exactly-once output.

Every fail point window is hit by plan, the two of unaligned checkpoints
among them: in-flight records half written with a checkpoint
(``channel_state_write``), and half replayed after a restore
(``channel_state_replay``). pv_count at parallelism 2 behind a slow
``map_async`` step (``app.slow_ms``): the source runs into backpressure, so
every checkpoint's barrier overtakes a full channel and the step's calls are
in flight too. The committed output is proven against a failure-free
reference run and against an independent recount of the input.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aiostream_ckpt.failpoints import POINTS
from aiostream_ckpt_dev.chaos.windows import MAIN_RUNNING, UNALIGNED_WINDOWS, Kill, run_round
from aiostream_ckpt_dev.validate.proof import AppRun, compare_dirs, compare_oracle, reference_run
from apps import pv_count
from tests.helpers import cli_cmd, in_flight_records, make_pv_input

pytestmark = pytest.mark.integration

PLAN = [
    Kill("metadata_durable", 2),
    Kill("channel_state_write", 2),
    Kill("channel_state_replay"),
    Kill("pre_barrier_flush", 3),
    Kill("restore_begin"),
    Kill("snapshot_write", 2),
    Kill("restore_before_sinks"),
    Kill("sink_commit", 2),
    Kill("restore_after_sinks"),
    Kill("final_metadata_durable"),
    Kill("final_committed"),
]


def test_a_kill_in_every_window_keeps_pv_count_exact_with_unaligned_checkpoints(
    tmp_path: Path,
) -> None:
    # the windows of a local checkpoint directory and a file sink (the Delta sink's, the
    # object store's and savepoints' have tests of their own), those of unaligned ones too
    windows = {k.window for k in PLAN}
    assert set(UNALIGNED_WINDOWS) <= windows <= set(POINTS)
    inputs = [
        make_pv_input(tmp_path / f"in-{i}.jsonl", 100_000, seed=40 + i, keys=50, malformed=1)
        for i in range(2)
    ]
    sets = [
        f"app.input={','.join(map(str, inputs))}",
        f"app.output={tmp_path / 'out'}",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "app.slow_ms=1",
        "job.parallelism=2",
        "checkpoint.interval=30ms",
        "checkpoint.unaligned=true",
        "job.batch_size=256",
    ]
    cmd = cli_cmd(
        "run", "apps.pv_count", *[a for s in [*sets, "rest.port=0"] for a in ("--set", s)]
    )
    log = tmp_path / "worker.log"
    result = run_round(cmd, PLAN, inputs=inputs, log_path=log, timeout=600)
    text = log.read_text()
    assert result.exit_code == 0, text[-3000:]
    assert dict(result.kills) == dict.fromkeys(windows, 1), (result.kills, result.missed)
    for w in windows:
        assert f"failpoint {w}: SIGKILL" in text
    assert in_flight_records(text), "no checkpoint held in-flight records"

    run = AppRun("apps.pv_count", sets)
    reference_run(run, pv_count.PROOF, tmp_path / "ref")
    proof = compare_dirs(tmp_path / "out", tmp_path / "ref" / "out-output", pv_count.PROOF)
    assert proof.passed, (proof.counts, proof.examples)
    assert proof.counts["records_out"] == 200_000
    dead = compare_dirs(
        tmp_path / "ckpt" / "dead-letter" / "events",
        tmp_path / "ref" / "dead-letter" / "events",
        pv_count.PROOF,
    )
    assert dead.passed and dead.counts["records_out"] == 2, dead.counts
    assert pv_count.PROOF.oracle is not None
    recount = compare_oracle(
        tmp_path / "out", pv_count.PROOF.oracle({"input": sets[0][10:]}), pv_count.PROOF
    )
    assert recount.passed, recount.counts


@pytest.mark.parametrize("timeout", [None, "20ms"], ids=["unaligned", "aligned-timeout"])
def test_at_two_workers_in_flight_records_cross_processes_and_survive_worker_kills(
    tmp_path: Path, timeout: str | None
) -> None:
    """``job.workers=2``: the slow step's keyed channels cross the workers' socket.

    The windows of unaligned checkpoints kill a worker of the run's first
    attempt (the main process restarts every worker from the latest
    checkpoint, then is killed itself once that attempt checkpointed); the
    coordinator's window kills the main process. With ``checkpoint.aligned_timeout``
    each checkpoint starts aligned and turns unaligned where its barrier waits
    behind the full channels longer than that.
    """
    inputs = [make_pv_input(tmp_path / f"in-{i}.jsonl", 60_000, seed=50 + i) for i in range(2)]
    sets = [
        f"app.input={','.join(map(str, inputs))}",
        f"app.output={tmp_path / 'out'}",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "app.slow_ms=1",
        "job.parallelism=2",
        "job.workers=2",
        "restart.delay=0s",
        "checkpoint.interval=30ms",
        "checkpoint.unaligned=true",
        "job.batch_size=256",
        *([f"checkpoint.aligned_timeout={timeout}"] if timeout else []),
    ]
    cmd = cli_cmd(
        "run", "apps.pv_count", *[a for s in [*sets, "rest.port=0"] for a in ("--set", s)]
    )
    plan = [
        Kill("metadata_durable", 2),
        Kill("channel_state_write", 2, after=0.1),
        Kill("channel_state_replay", after=0.1),
        Kill("position", fraction=0.1, worker=1),
    ]
    log = tmp_path / "worker.log"
    result = run_round(cmd, plan, inputs=inputs, log_path=log, timeout=600, workers=2)
    text = log.read_text()
    assert result.exit_code == 0, text[-3000:]
    assert result.kills["metadata_durable"] == 1, result.kills
    assert result.kills["worker:channel_state_write"] == 1, (result.kills, result.missed)
    assert result.kills["worker:channel_state_replay"] == 1, (result.kills, result.missed)
    assert result.kills[MAIN_RUNNING] >= 2, result.kills
    assert in_flight_records(text), "no checkpoint held in-flight records"
    assert pv_count.PROOF.oracle is not None
    recount = compare_oracle(
        tmp_path / "out", pv_count.PROOF.oracle({"input": sets[0][10:]}), pv_count.PROOF
    )
    assert recount.passed and recount.counts["records_out"] == 120_000, recount.counts
