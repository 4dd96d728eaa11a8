"""The reference-run proof at scale: the same comparison as :mod:`.proof`, in PySpark.

For outputs too big for one Python process (or to run on a cluster with
``--master``). Both outputs are read as text (files in commit order, lines in
file order, see :mod:`.readers`; topics by Spark's Kafka source with
``read_committed``, in partition and offset order), put in canonical form by the same per-line
function as the fast path, and compared with ``exceptAll`` both ways:
reference minus output is what is missing, output minus reference is extra
(duplicated when the reference has the record at all, else unexpected). With a
declared key, each key's records are numbered in commit order on both sides
and joined by ``(key, n)``: keys that differ there but not as multisets are
reordered.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiostream_ckpt.api.contract import ProofContract
from aiostream_ckpt_dev.validate import parse
from aiostream_ckpt_dev.validate.proof import (
    MAX_EXAMPLES,
    ComparedOutput,
    Comparison,
    Location,
    ObjectOutput,
    describe,
    local_copy,
    output_files,
    to_result,
)
from aiostream_ckpt_dev.validate.proof_kafka import KafkaTopic
from aiostream_ckpt_dev.validate.readers import _read_lines, read_kafka_output
from aiostream_ckpt_dev.validate.result import CheckResult
from aiostream_ckpt_dev.validate.tables import delta_files, is_delta_table, parquet_files

_EMPTY = "canon string, key string, parsed boolean, forder long, blk long, mid long, file string"


def load_output(spark: Any, where: Location, contract: ProofContract) -> Any:
    """One output's records: canonical form, key, and their commit order."""
    from pyspark.sql import functions as F

    canon = parse.udf(
        parse.canonical_parser(contract.key, contract.ignore_fields), parse.CANONICAL_SCHEMA
    )
    if isinstance(where, KafkaTopic):
        return _load_topic(spark, where, canon)
    if isinstance(where, ObjectOutput):  # Spark here has no S3 filesystem: a local copy
        where = local_copy(where.url)
    if is_delta_table(where) or parquet_files(where):
        return _load_table(spark, where, canon)
    files = output_files(where)
    if not files:
        return spark.createDataFrame([], _EMPTY)
    order = spark.createDataFrame(
        [(f.name, i) for i, f in enumerate(files)], "file_name string, forder long"
    )
    return (
        _read_lines(spark, files)
        .where(F.trim("value") != "")
        .join(F.broadcast(order), "file_name")
        .select(
            canon("value").alias("p"),
            "forder",
            "blk",
            "mid",
            F.col("file_name").alias("file"),
        )
        .select("p.canon", "p.key", "p.parsed", "forder", "blk", "mid", "file")
    )


def _load_table(spark: Any, where: Path, canon: Any) -> Any:
    """Read a Delta table (Delta Lake for Spark) or Parquet part files, each row as JSON.

    Commit order: the numbers in the file names (checkpoint, subtask), then
    the rows of a file as Spark reads them (``mid`` grows within a split).
    """
    from pyspark.sql import functions as F

    if is_delta_table(where):
        df = spark.read.format("delta").load(str(where))
        names = [p.rsplit("/", 1)[-1] for p, _ in delta_files(where)]
    else:
        files = parquet_files(where)
        df = spark.read.parquet(*[str(f) for f in files])
        names = [f.name for f in files]
    if not names:
        return spark.createDataFrame([], _EMPTY)
    order = spark.createDataFrame(
        [(n, i) for i, n in enumerate(names)], "file_name string, forder long"
    )
    rows = df.select(
        F.to_json(F.struct(*[F.col(c) for c in df.columns])).alias("value"),
        F.col("_metadata.file_name").alias("file_name"),
        F.col("_metadata.file_block_start").alias("blk"),
        F.monotonically_increasing_id().alias("mid"),
    )
    return (
        rows.join(F.broadcast(order), "file_name")
        .select(canon("value").alias("p"), "forder", "blk", "mid", F.col("file_name").alias("file"))
        .select("p.canon", "p.key", "p.parsed", "forder", "blk", "mid", "file")
    )


def _load_topic(spark: Any, where: KafkaTopic, canon: Any) -> Any:
    """Read a topic by Spark's Kafka source, read_committed; commit order: (partition, offset)."""
    from pyspark.sql import functions as F

    src = read_kafka_output(spark, where.bootstrap, where.topic, isolation="read_committed")
    at = F.concat(F.lit(f"{where.topic}/"), F.col("o1"), F.lit("@"), F.col("o2"))
    return src.df.select(
        canon("value").alias("p"),
        F.col("o1").alias("forder"),
        F.col("o2").alias("blk"),
        F.lit(0).cast("long").alias("mid"),
        at.alias("file"),
    ).select("p.canon", "p.key", "p.parsed", "forder", "blk", "mid", "file")


def compare_spark(
    spark: Any, out: ComparedOutput, contract: ProofContract, max_examples: int = MAX_EXAMPLES
) -> CheckResult:
    """Compare one output with its reference: one shuffle by record, one by key if ordered."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    side = F.col("side")
    both = (
        load_output(spark, out.actual, contract)
        .withColumn("side", F.lit(1))
        .unionByName(load_output(spark, out.reference, contract).withColumn("side", F.lit(0)))
        .cache()
    )
    per = (
        both.groupBy("canon", "key", "parsed")
        .agg(
            F.count(F.when(side == 1, 1)).alias("a"),
            F.count(F.when(side == 0, 1)).alias("r"),
            F.min(F.when(side == 1, F.col("file"))).alias("file"),
        )
        .cache()
    )
    a, r = F.col("a"), F.col("r")
    kinds = {
        "duplicated": (r > 0) & (a > r),
        "missing": r > a,
        "unexpected": (r == 0) & (a > 0),
        "malformed_out": ~F.col("parsed") & (a > 0),
    }
    amounts = {"duplicated": a - r, "missing": r - a, "unexpected": a, "malformed_out": a}
    stats = per.agg(
        F.sum("a").alias("records_out"),
        F.sum("r").alias("reference_records"),
        *(F.sum(F.when(kinds[k], amounts[k])).alias(k) for k in kinds),
    ).first()
    order = ("records_out", "reference_records", "duplicated", "missing", "unexpected")
    counts = {k: int(stats[k] or 0) for k in order}
    counts["reordered_keys"] = 0  # below, with a key
    counts["malformed_out"] = int(stats["malformed_out"] or 0)
    examples: dict[str, list[dict[str, Any]]] = {}
    for name, cond in kinds.items():
        if counts[name]:
            rows = per.where(cond).select("canon", "a", "r", "file").orderBy("canon")
            examples[name] = _rows(rows, max_examples)
    if contract.key is not None:
        unequal = per.where(a != r).select("key").distinct()
        counts["reordered_keys"], reordered = _reordered(both, unequal)
        if counts["reordered_keys"]:
            examples["reordered_keys"] = _rows(reordered.orderBy("key"), max_examples)
    both.unpersist()
    per.unpersist()
    notes = [f"{describe(out.actual)} vs reference {describe(out.reference)}"]
    return to_result(out.label, Comparison(counts, examples), time.monotonic() - started, notes)


def _reordered(both: Any, unequal: Any) -> tuple[int, Any]:
    """Keys equal as multisets whose n-th records differ in commit order, at the first n."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("side", "key").orderBy("forder", "blk", "mid")
    numbered = both.where(F.col("key").isNotNull()).select(
        "side", "key", "canon", F.row_number().over(w).alias("n")
    )
    got = numbered.where("side = 1").select("key", "n", F.col("canon").alias("got"))
    want = numbered.where("side = 0").select("key", "n", F.col("canon").alias("expected"))
    differ = (
        got.join(want, ["key", "n"])
        .where(F.col("got") != F.col("expected"))
        .join(F.broadcast(unequal), "key", "left_anti")
    )
    first = differ.groupBy("key").agg(F.min_by(F.struct("n", "got", "expected"), "n").alias("d"))
    first = first.select("key", "d.n", "d.got", "d.expected").cache()
    return first.count(), first


def _rows(df: Any, limit: int) -> list[dict[str, Any]]:
    return [r.asDict() for r in df.limit(limit).collect()]


def spark_results(
    spark: Any, plan: Sequence[ComparedOutput], contract: ProofContract
) -> list[CheckResult]:
    return [compare_spark(spark, out, contract) for out in plan]
