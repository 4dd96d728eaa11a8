"""kill -9 in the checkpoint windows of a job writing Parquet part files.

The Parquet sink is the staged-file sink with Parquet part files: a kill
before its pre-commit, between the durable metadata and the renames, in the
middle of the renames, and in recovery leaves committed Parquet files that
hold each record once (the recount, read as Spark reads the directory).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from aiostream_ckpt_dev.chaos.windows import Kill, run_round
from aiostream_ckpt_dev.validate.tables import parquet_files
from tests.helpers import check_pv_output, cli_cmd, make_pv_input, recount

pytestmark = pytest.mark.integration

PLAN = [
    Kill("metadata_durable", 2),
    Kill("pre_barrier_flush", 2),
    Kill("sink_commit", 2),
    Kill("restore_before_sinks"),
    Kill("final_metadata_durable"),
    Kill("final_committed"),
]


def test_a_kill_in_the_windows_keeps_the_parquet_output_exact(tmp_path: Path) -> None:
    inputs = [make_pv_input(tmp_path / f"in-{i}.jsonl", 40_000, seed=20 + i) for i in range(2)]
    out = tmp_path / "out"
    sets = [
        f"app.input={','.join(map(str, inputs))}",
        f"app.output={out}",
        "app.sink=parquet",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "job.parallelism=2",
        "checkpoint.interval=60ms",
        "job.batch_size=256",
        "app.rate=20000",
    ]
    cmd = cli_cmd(
        "run", "apps.pv_count", *[a for s in [*sets, "rest.port=0"] for a in ("--set", s)]
    )
    log = tmp_path / "worker.log"
    result = run_round(cmd, PLAN, inputs=inputs, log_path=log, timeout=600)
    assert result.exit_code == 0, log.read_text()[-3000:]
    assert dict(result.kills) == {k.window: 1 for k in PLAN}, (result.kills, result.missed)
    check = check_pv_output(out, recount(*inputs))
    assert check.exact and check.records == 80_000, (check.duplicates, check.gaps)
    files = parquet_files(out)
    assert len(files) > 4 and all(pq.ParquetFile(f).metadata.num_rows for f in files)
