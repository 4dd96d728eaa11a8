r"""Read the job's input and its committed output into Spark DataFrames.

Every output DataFrame has the same columns, so the checks don't care where
output came from: ``value`` (the record's JSON text), ``at`` (where it was,
for reports: ``part-...jsonl:12`` or ``topic/0@1234``) and ``o1, o2, o3``,
which sort records into commit order.

Spark's text reader gives no line numbers or byte offsets. Lines of one file
split come in file order, though, and splits of a file differ in
``_metadata.file_block_start``, so ``(block start, monotonically_increasing_id)``
orders a file's lines exactly; line numbers and byte offsets are window sums
over that order (reading with ``lineSep="\n"`` keeps any ``\r`` in the line,
so its UTF-8 length plus one is the bytes it took).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiostream_ckpt.validate import parse
from aiostream_ckpt.validate.errors import ValidationConfigError, ValidationError

OUTPUT_SCHEMA = "value string, at string, o1 long, o2 long, o3 long"

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


@dataclass
class OutputSource:
    """Output records plus what a report should say about where they came from."""

    df: Any
    description: str
    notes: list[str] = field(default_factory=list)


def input_files(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Expand directories (their visible regular files, sorted) and check every path exists."""
    files: list[Path] = []
    for raw in paths:
        p = Path(raw).resolve()
        if p.is_dir():
            files.extend(sorted(c for c in p.iterdir() if c.is_file() and not _hidden(c.name)))
        elif p.is_file():
            files.append(p)
        else:
            raise ValidationConfigError(f"input {raw} does not exist")
    if not files:
        raise ValidationConfigError(f"no input files in {[str(p) for p in paths]}")
    return files


def read_input(
    spark: Any,
    paths: Sequence[str | os.PathLike[str]],
    *,
    key_field: str = "app_id",
    positions: bool = False,
) -> Any:
    """Read JSON-lines input: ``status`` and ``key`` (see :mod:`.parse`) per line.

    With ``positions``, also ``src`` (file name), ``off`` (byte offset of the
    line, as the file source records it) and ``at`` (``name:line``); file
    names must then be unique, since positions are matched by name.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    files = input_files(paths)
    if positions:
        dupes = [n for n, c in Counter(f.name for f in files).items() if c > 1]
        if dupes:
            raise ValidationConfigError(
                f"input files share names {dupes}; positions are matched by file name"
            )
    parser = parse.udf(parse.input_parser(key_field), parse.INPUT_SCHEMA)
    df = _read_lines(spark, files)
    if positions:
        in_file = Window.partitionBy("file_name").orderBy("blk", "mid")
        before = in_file.rowsBetween(Window.unboundedPreceding, -1)
        df = (
            df.withColumn("line", F.row_number().over(in_file))
            .withColumn(
                "off", F.coalesce(F.sum(F.octet_length("value") + 1).over(before), F.lit(0))
            )
            .withColumn("src", F.col("file_name"))
            .withColumn("at", F.concat_ws(":", "file_name", F.col("line").cast("string")))
        )
    return df.withColumn("p", parser("value")).select(
        F.col("p.status").alias("status"),
        F.col("p.key").alias("key"),
        *(["src", "off", "at"] if positions else []),
    )


def read_file_sink_output(
    spark: Any, directory: str | os.PathLike[str], *, prefix: str = "part"
) -> OutputSource:
    """Read the committed files of the exactly-once file sink, in commit order.

    Hidden files (staged: in-progress or pre-committed, not committed) are
    skipped. Both spellings of the committed name are understood, told apart
    by width: ``part-<subtask:04d>-<checkpoint:010d>.jsonl`` (the agreed
    format) and ``part-<checkpoint:010d>-<subtask:04d>.jsonl`` (what
    ``connectors/staging.py`` writes, so names sort in commit order).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    d = Path(directory)
    if not d.is_dir():
        raise ValidationConfigError(f"output dir {directory} does not exist")
    committed: list[tuple[str, int, int]] = []
    staged: list[str] = []
    other: list[str] = []
    for entry in sorted(d.iterdir()):
        if _hidden(entry.name):
            staged.append(entry.name)
        elif entry.is_file() and (parsed := committed_name(entry.name, prefix)) is not None:
            committed.append((entry.name, *parsed))
        else:
            other.append(entry.name)
    notes = [f"{len(committed)} committed files, {len(staged)} hidden (staged) files ignored"]
    if other:
        notes.append(f"ignored {len(other)} other entries: {other[:5]}")
    if not committed:
        return OutputSource(spark.createDataFrame([], OUTPUT_SCHEMA), str(d), notes)
    names = spark.createDataFrame(committed, "file_name string, o1 long, o2 long")
    df = _read_lines(spark, [d / name for name, _, _ in committed])
    in_file = Window.partitionBy("file_name").orderBy("blk", "mid")
    df = (
        df.join(F.broadcast(names), "file_name")
        .withColumn("o3", F.row_number().over(in_file))
        .select(
            "value",
            F.concat_ws(":", "file_name", F.col("o3").cast("string")).alias("at"),
            "o1",
            "o2",
            F.col("o3").cast("long").alias("o3"),
        )
    )
    return OutputSource(df, str(d), notes)


def committed_name(name: str, prefix: str = "part") -> tuple[int, int] | None:
    """Return ``(checkpoint id, subtask)`` of a committed file name, None for other names."""
    m = re.fullmatch(rf"{re.escape(prefix)}-(\d+)-(\d+)\.jsonl", name)
    if m is None:
        return None
    a, b = m.groups()
    if len(a) == 4 and len(b) >= 10:
        return int(b), int(a)
    if len(a) >= 10 and len(b) == 4:
        return int(a), int(b)
    return None


def read_kafka_output(
    spark: Any,
    bootstrap_servers: str,
    topic: str,
    *,
    isolation: str = "read_committed",
) -> OutputSource:
    """Read a whole topic in batch mode, ordered by (partition, offset).

    ``read_committed`` makes "latest" the last stable offset and skips aborted
    records and transaction markers; ``read_uncommitted`` exists to show that
    the checks catch aborted records. ``failOnDataLoss`` is off for the
    latter, since its offset gaps (markers) are not lost data.
    """
    from pyspark.sql import functions as F

    if isolation not in ISOLATION_LEVELS:
        raise ValidationConfigError(
            f"isolation must be one of {ISOLATION_LEVELS}, not {isolation!r}"
        )
    try:
        df = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap_servers)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .option("kafka.isolation.level", isolation)
            .option("failOnDataLoss", str(isolation == "read_committed").lower())
            .load()
        )
    except Exception as exc:
        raise ValidationError(
            f"cannot read Kafka topic {topic!r} at {bootstrap_servers}: {exc}"
        ) from exc
    df = df.select(
        F.col("value").cast("string").alias("value"),
        F.format_string("%s/%d@%d", "topic", "partition", "offset").alias("at"),
        F.col("partition").cast("long").alias("o1"),
        F.col("offset").alias("o2"),
        F.lit(0).cast("long").alias("o3"),
    )
    return OutputSource(df, f"kafka {bootstrap_servers} topic {topic} ({isolation})")


def _read_lines(spark: Any, files: Sequence[Path]) -> Any:
    from pyspark.sql import functions as F

    return (
        spark.read.option("lineSep", "\n")
        .text([str(f) for f in files])
        .select(
            "value",
            F.col("_metadata.file_name").alias("file_name"),
            F.col("_metadata.file_block_start").alias("blk"),
            F.monotonically_increasing_id().alias("mid"),
        )
    )


def _hidden(name: str) -> bool:
    return name.startswith((".", "_"))
