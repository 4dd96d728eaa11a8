"""kill -9 in every checkpoint window of a job writing a Delta table.

Each window is hit by plan (``AIOSTREAM_FAILPOINTS``), including the Delta
sink's own: its data files written at a barrier and in no commit, a complete
checkpoint before its Delta commit, and the commit made before any task was
told. The table then holds each record once (an independent recount, and the
proof against a failure-free run), and a reader polling the table through
delta-rs while the job ran and died never saw a partial checkpoint: at every
version it read, each key's counts are exactly 1..m.
"""

from __future__ import annotations

import collections
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from aiostream_ckpt.failpoints import POINTS
from aiostream_ckpt_dev.chaos.windows import DELTA_WINDOWS, Kill, run_round
from aiostream_ckpt_dev.validate.proof import AppRun, compare_dirs, reference_run
from apps import pv_count
from tests.helpers import check_pv_output, cli_cmd, make_pv_input, recount

pytestmark = pytest.mark.integration

PLAN = [
    Kill("metadata_durable", 2),
    Kill("delta_files_written", 3),
    Kill("delta_commit", 2),
    Kill("restore_before_sinks"),
    Kill("delta_committed", 2),
    Kill("restore_after_sinks"),
    Kill("pre_barrier_flush", 2),
    Kill("final_metadata_durable"),
    Kill("final_committed"),
]


class TableWatcher:
    """Reads the table's newest version in a loop; records what a partial commit would break."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.versions: set[int] = set()
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TableWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                table = DeltaTable(str(self.path))
                rows = pa.table(table.to_pyarrow_table()).to_pylist()
            except Exception:  # not created yet, or a file vacuumed under the reader
                continue
            version = table.version()
            if version in self.versions:
                continue
            self.versions.add(version)
            seen: dict[str, list[int]] = collections.defaultdict(list)
            for r in rows:
                seen[r["app_id"]].append(r["pv"])
            for key, values in seen.items():
                if sorted(values) != list(range(1, len(values) + 1)):
                    self.problems.append(f"version {version}: {key} has {sorted(values)[:10]}")


@pytest.mark.parametrize("parallelism", [2])
def test_a_kill_in_every_window_keeps_the_delta_table_exact(
    tmp_path: Path, parallelism: int
) -> None:
    assert set(DELTA_WINDOWS) <= {k.window for k in PLAN} and set(DELTA_WINDOWS) <= set(POINTS)
    inputs = [
        make_pv_input(tmp_path / f"in-{i}.jsonl", 60_000, seed=i, keys=50, malformed=1)
        for i in range(parallelism)
    ]
    table = tmp_path / "table"
    sets = [
        f"app.input={','.join(map(str, inputs))}",
        f"app.output={table}",
        "app.sink=delta",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        f"job.parallelism={parallelism}",
        "checkpoint.interval=60ms",
        "job.batch_size=256",
        "app.rate=20000",
    ]
    cmd = cli_cmd(
        "run", "apps.pv_count", *[a for s in [*sets, "rest.port=0"] for a in ("--set", s)]
    )
    log = tmp_path / "worker.log"
    with TableWatcher(table) as watcher:
        result = run_round(cmd, PLAN, inputs=inputs, log_path=log, timeout=600)
    assert result.exit_code == 0, log.read_text()[-3000:]
    assert dict(result.kills) == {k.window: 1 for k in PLAN}, (result.kills, result.missed)
    assert watcher.problems == [] and len(watcher.versions) > 3, watcher.problems[:5]

    check = check_pv_output(table, recount(*inputs))
    assert check.exact and check.records == 60_000 * parallelism, (check.duplicates, check.gaps)
    run = AppRun("apps.pv_count", sets)
    reference_run(run, pv_count.PROOF, tmp_path / "ref")
    proof = compare_dirs(table, tmp_path / "ref" / "out-output", pv_count.PROOF)
    assert proof.passed, (proof.counts, proof.examples)


def test_at_two_workers_one_commit_is_made_in_the_main_process(tmp_path: Path) -> None:
    """Subtasks in two worker processes; the Delta commit where the coordinator runs.

    A worker is killed after writing its data files at a barrier, the main
    process right before and right after a Delta commit: the table still holds
    each record once, and every commit of the run is one per checkpoint.
    """
    inputs = [make_pv_input(tmp_path / f"in-{i}.jsonl", 40_000, seed=7 + i) for i in range(2)]
    table = tmp_path / "table"
    sets = [
        f"app.input={','.join(map(str, inputs))}",
        f"app.output={table}",
        "app.sink=delta",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "job.parallelism=2",
        "job.workers=2",
        "restart.delay=0s",
        "checkpoint.interval=60ms",
        "job.batch_size=256",
        "app.rate=20000",
    ]
    cmd = cli_cmd(
        "run", "apps.pv_count", *[a for s in [*sets, "rest.port=0"] for a in ("--set", s)]
    )
    plan = [Kill("metadata_durable", 2), Kill("delta_files_written", 2), Kill("delta_commit", 2)]
    plan += [Kill("delta_committed", 2)]
    log = tmp_path / "worker.log"
    result = run_round(cmd, plan, inputs=inputs, log_path=log, timeout=600, workers=2)
    assert result.exit_code == 0, log.read_text()[-3000:]
    assert result.kills["worker:delta_files_written"] == 1, (result.kills, result.missed)
    assert result.kills["delta_commit"] == 1 and result.kills["delta_committed"] == 1
    check = check_pv_output(table, recount(*inputs))
    assert check.exact and check.records == 80_000, (check.duplicates, check.gaps)
    history = DeltaTable(str(table)).history()
    versions = [int(h["aiostream.checkpoint"]) for h in history if "aiostream.checkpoint" in h]
    assert len(versions) >= 3 and len(versions) == len(set(versions)), versions
