"""Spark reads the Delta table and the Parquet files, and the proof compares them both ways.

A real pv_count run (the CLI, killed once between a checkpoint's durable
metadata and its Delta commit) writes a Delta table; the reference-run proof
compares it with a failure-free run through Spark (Delta Lake for Spark from
Maven Central, offline) and through the Spark-free path (delta-rs, pyarrow),
and both must agree, also on a table a planted commit duplicated a file in.
Spark then consumes the table as the docs page shows, in batch and in
Structured Streaming.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.transaction import AddAction

from aiostream_ckpt_dev.validate.proof import (
    AppRun,
    ComparedOutput,
    compare_dirs,
    plan_outputs,
    reference_run,
)
from aiostream_ckpt_dev.validate.proof_spark import spark_results
from aiostream_ckpt_dev.validate.session import get_spark
from apps import pv_count
from tests.helpers import cli, make_pv_input

pytestmark = [pytest.mark.integration, pytest.mark.spark]

EVENTS = 30_000
PV = pv_count.PROOF


def _run(tmp_path: Path, sink: str, env: dict[str, str] | None = None) -> tuple[Path, Path]:
    inp = make_pv_input(tmp_path / "in.jsonl", EVENTS, seed=3, keys=40)
    out = tmp_path / "out"
    sets = [
        f"app.input={inp}",
        f"app.output={out}",
        f"app.sink={sink}",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "checkpoint.interval=50ms",
        "job.parallelism=2",
        "app.rate=30000",
    ]
    args = ["run", "apps.pv_count", *[a for s in [*sets, "rest.port=0"] for a in ("--set", s)]]
    first = cli(*args, env={**os.environ, **(env or {})}, timeout=300)
    if env:  # killed at the fail point: the same command resumes
        assert first.returncode == -9, first.stderr[-2000:]
        first = cli(*args, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    run = AppRun("apps.pv_count", sets)
    reference_run(run, PV, tmp_path / "ref")
    (planned,) = [p for p in plan_outputs(run, PV, tmp_path / "ref") if p.label == "output"]
    assert planned.reference == tmp_path / "ref" / "out-output"
    return out, planned.reference


@pytest.fixture(scope="module")
def delta_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("delta")
    return _run(tmp, "delta", {"AIOSTREAM_FAILPOINTS": "delta_commit=kill@2"})


def test_spark_and_the_spark_free_path_prove_the_delta_table(
    spark: Any, delta_run: tuple[Path, Path], tmp_path: Path
) -> None:
    out, ref = delta_run
    fast = compare_dirs(out, ref, PV)
    assert fast.passed and fast.counts["records_out"] == EVENTS, fast.counts
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    _commit_a_duplicate_file(bad)
    plan = [ComparedOutput("output", out, ref), ComparedOutput("bad", bad, ref)]
    results = spark_results(get_spark(delta=True), plan, PV)
    assert results[0].passed and results[0].counts == fast.counts, results[0].counts
    wrong = compare_dirs(bad, ref, PV)
    assert not results[1].passed and results[1].counts == wrong.counts
    assert wrong.counts["duplicated"] > 0 and wrong.counts["missing"] == 0


def _commit_a_duplicate_file(table_dir: Path) -> None:
    """A broken sink's commit: one data file added again under another name."""
    table = DeltaTable(str(table_dir))
    first = pa.table(table.get_add_actions(flatten=True)).to_pylist()[0]
    copy = "copy-" + first["path"].rsplit("/", 1)[-1]
    shutil.copy(table_dir / first["path"], table_dir / copy)
    add = AddAction(copy, first["size_bytes"], {}, first["modification_time"], True, "{}")
    table.create_write_transaction([add], mode="append", schema=table.schema())


def test_spark_reads_the_table_in_batch_and_structured_streaming(
    spark: Any, delta_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """The docs page's jobs (docs/delta-and-parquet.md), on the table the job wrote."""
    from pyspark.sql import functions as F

    out, _ = delta_run
    session = get_spark(delta=True)
    batch = session.read.format("delta").load(str(out))
    latest = batch.groupBy("app_id").agg(F.max("pv").alias("pv"))
    assert batch.count() == EVENTS and latest.agg(F.sum("pv")).first()[0] == EVENTS
    stream = (
        session.readStream.format("delta")
        .load(str(out))
        .writeStream.format("memory")
        .queryName("pv_updates")
        .option("checkpointLocation", str(tmp_path / "stream-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    stream.awaitTermination(240)
    assert session.sql("select count(*) from pv_updates").first()[0] == EVENTS


def test_spark_and_the_spark_free_path_prove_parquet_output(spark: Any, tmp_path: Path) -> None:
    out, ref = _run(tmp_path, "parquet")
    assert not any(p.name.endswith(".jsonl") for p in out.iterdir())
    fast = compare_dirs(out, ref, PV)
    assert fast.passed and fast.counts["records_out"] == EVENTS, fast.counts
    (result,) = spark_results(get_spark(), [ComparedOutput("output", out, ref)], PV)
    assert result.passed and result.counts == fast.counts
