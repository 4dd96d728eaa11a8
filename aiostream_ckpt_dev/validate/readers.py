r"""Read the job's input and its committed output into Spark DataFrames.

Every output DataFrame has the same columns, so the checks don't care where
output came from: ``value`` (the record's JSON text) and ``o1..o4``, which sort
records into commit order and say where each one is. :attr:`OutputSource.locate`
turns those into ``part-...jsonl:12`` or ``topic/0@1234`` for the few records a
report names, so no line numbers are computed for the million that are fine.

Spark's text reader gives no line numbers or byte offsets. The lines of one
file split come in file order, though, each split is read by one task, and
splits of a file differ in ``_metadata.file_block_start``: so ``(block start,
monotonically_increasing_id)`` orders a file's lines exactly, without
shuffling the lines to number them. Input byte offsets are a window sum of
line lengths over that order, taken after parsing so only narrow rows move
(reading with ``lineSep="\n"`` keeps any ``\r`` in the line, so its UTF-8
length plus one is the bytes it took).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiostream_ckpt.keygroups import Shard
from aiostream_ckpt.runtime.failover.ownership import LOCK_FILE
from aiostream_ckpt_dev.validate import parse
from aiostream_ckpt_dev.validate.errors import ValidationConfigError, ValidationError
from aiostream_ckpt_dev.validate.tables import shard_directories

OUTPUT_SCHEMA = "value string, o1 long, o2 long, o3 long, o4 long"
#: The columns that order output records and say where each one is.
ORDER = ("o1", "o2", "o3", "o4")

#: An output record's place: the values of :data:`ORDER`.
Place = tuple[int, int, int, int]

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


@dataclass
class OutputSource:
    """Output records, how to name where one is, and what a report should say about them."""

    df: Any
    description: str
    locate: Callable[[Sequence[Place]], list[str]]
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
    line, as the file source records it) and ``line`` (1-based); file names
    must then be unique, since positions are matched by name.
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
    df = _read_lines(spark, files).select(
        "file_name",
        "blk",
        "mid",
        F.octet_length("value").alias("length"),
        parser("value").alias("p"),
    )
    cols = [F.col("p.status").alias("status"), F.col("p.key").alias("key")]
    if not positions:
        return df.select(*cols)
    in_file = Window.partitionBy("file_name").orderBy("blk", "mid")
    before = in_file.rowsBetween(Window.unboundedPreceding, -1)
    return df.select(
        *cols,
        F.col("file_name").alias("src"),
        F.coalesce(F.sum(F.col("length") + 1).over(before), F.lit(0)).alias("off"),
        F.row_number().over(in_file).alias("line"),
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
    Order: ``o1`` checkpoint, ``o2`` subtask, ``o3, o4`` line within the file.
    """
    from pyspark.sql import functions as F

    d = Path(directory)
    if not d.is_dir():
        raise ValidationConfigError(f"output dir {directory} does not exist")
    committed: list[tuple[str, int, int]] = []
    paths: list[Path] = []
    staged: list[str] = []
    other: list[str] = []
    # a sharded job's shards write into shard-I-of-N subdirectories: those files too
    for entry in sorted(e for where in shard_directories(d) for e in where.iterdir()):
        if entry.name == LOCK_FILE:
            continue  # the running job's ownership of the directory, not output
        if _hidden(entry.name):
            staged.append(entry.name)
        elif entry.is_file() and (parsed := committed_name(entry.name, prefix)) is not None:
            committed.append((entry.name, *parsed))
            paths.append(entry)
        elif not (entry.is_dir() and Shard.from_dirname(entry.name)):
            other.append(entry.name)
    notes = [f"{len(committed)} committed files, {len(staged)} hidden (staged) files ignored"]
    if other:
        notes.append(f"ignored {len(other)} other entries: {other[:5]}")
    if not committed:
        empty = spark.createDataFrame([], OUTPUT_SCHEMA)
        return OutputSource(empty, str(d), lambda places: ["?"] * len(places), notes)
    names = spark.createDataFrame(committed, "file_name string, o1 long, o2 long")
    df = (
        _read_lines(spark, paths)
        .join(F.broadcast(names), "file_name")
        .select("value", "o1", "o2", F.col("blk").alias("o3"), F.col("mid").alias("o4"))
    )
    locator = _LineLocator(df, {(c, s): n for n, c, s in committed})
    return OutputSource(df, str(d), locator, notes)


class _LineLocator:
    """Turn ``(checkpoint, subtask, block start, row id)`` into ``file:line``.

    Needs each split's first row id and row count, a cheap scan done once and
    only when a report names a record.
    """

    def __init__(self, df: Any, names: dict[tuple[int, int], str]) -> None:
        self._df = df
        self._names = names
        self._splits: dict[tuple[int, int, int], int] | None = None

    def __call__(self, places: Sequence[Place]) -> list[str]:
        from pyspark.sql import functions as F

        if self._splits is None:
            rows = self._df.groupBy("o1", "o2", "o3").agg(F.min("o4"), F.count("*")).collect()
            splits = sorted((int(a), int(b), int(c), int(m), int(n)) for a, b, c, m, n in rows)
            self._splits = {}
            lines_before = 0
            for i, (ck, sub, blk, first, count) in enumerate(splits):
                if i == 0 or splits[i - 1][:2] != (ck, sub):
                    lines_before = 0
                self._splits[(ck, sub, blk)] = lines_before - first  # line = this + row id + 1
                lines_before += count
        out = []
        for ck, sub, blk, row in places:
            base = self._splits.get((ck, sub, blk), 0)
            out.append(f"{self._names.get((ck, sub), '?')}:{base + row + 1}")
        return out


def committed_name(name: str, prefix: str = "part") -> tuple[int, int] | None:
    """Return ``(checkpoint id, subtask)`` of a committed file name, None for other names.

    A name of committed output whose order can't be told raises: skipping it
    would hide output from the proof.
    """
    m = re.fullmatch(rf"{re.escape(prefix)}-(\d+)-(\d+)\.jsonl", name)
    if m is None:
        return None
    a, b = m.groups()
    if len(a) == 4 and len(b) >= 10:
        return int(b), int(a)
    if len(a) >= 10 and len(b) == 4:
        return int(a), int(b)
    raise ValidationConfigError(
        f"committed file {name}: expected a 4-digit subtask and a 10-digit checkpoint id"
    )


def read_kafka_output(
    spark: Any,
    bootstrap_servers: str,
    topic: str,
    *,
    isolation: str = "read_committed",
    timeout_s: float = 20.0,
) -> OutputSource:
    """Read a whole topic in batch mode, ordered by (partition, offset).

    Order: ``o1`` partition, ``o2`` offset. ``read_committed`` makes "latest"
    the last stable offset and skips aborted records and transaction markers;
    ``read_uncommitted`` exists to show that the checks catch aborted records.
    ``failOnDataLoss`` stays on: Spark tells marker gaps from lost data under
    both levels (tried), and records deleted by retention must not pass silently.
    ``timeout_s`` bounds each offset lookup; Spark's defaults (60 s, 3 tries)
    take almost two minutes to report an unreachable broker.
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
            .option("kafka.default.api.timeout.ms", str(int(timeout_s * 1000)))
            .option("kafka.request.timeout.ms", str(int(timeout_s * 1000)))
            .option("fetchOffset.numRetries", "1")
            .load()
        )
    except Exception as exc:
        raise ValidationError(
            f"cannot read Kafka topic {topic!r} at {bootstrap_servers}: {exc}"
        ) from exc
    df = df.select(
        F.col("value").cast("string").alias("value"),
        F.col("partition").cast("long").alias("o1"),
        F.col("offset").alias("o2"),
        F.lit(0).cast("long").alias("o3"),
        F.lit(0).cast("long").alias("o4"),
    )

    def locate(places: Sequence[Place]) -> list[str]:
        return [f"{topic}/{p[0]}@{p[1]}" for p in places]

    return OutputSource(df, f"kafka {bootstrap_servers} topic {topic} ({isolation})", locate)


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
