"""Reading Delta tables and Parquet part files as their readers do, without Spark.

The proof's fast path for the table sinks (Spark's is in :mod:`.proof_spark`).
It shares no code with the sinks it checks: a Delta table is read through
delta-rs's snapshot of its newest version (what any Delta reader sees, so a
checkpoint half committed would show), a Parquet directory as its visible
``*.parquet`` files. Commit order is the order of the numbers in the file
names (the sinks name files by checkpoint, then subtask), rows in file order;
partition values come from the log, as Delta readers add them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from aiostream_ckpt.keygroups import Shard
from aiostream_ckpt_dev.validate.errors import ValidationConfigError

_NUMBERS = re.compile(r"\d+")


def is_delta_table(directory: Path) -> bool:
    return (directory / "_delta_log").is_dir()


def _commit_order(name: str) -> tuple[list[int], str]:
    base = name.rsplit("/", 1)[-1]
    return [int(n) for n in _NUMBERS.findall(base)], name


def shard_directories(directory: Path) -> list[Path]:
    """Return ``directory`` and its sharded job's ``shard-I-of-N`` subdirectories (if it exists).

    A sharded job's file sinks write each shard's files into one of those.
    """
    if not directory.is_dir():
        return []
    shards = [d for d in directory.iterdir() if Shard.from_dirname(d.name) and d.is_dir()]
    return [directory, *sorted(shards)]


def parquet_files(directory: Path) -> list[Path]:
    """Visible ``*.parquet`` files of ``directory`` (and its shards') in commit order.

    Staged files are hidden.
    """
    files = [
        p
        for d in shard_directories(directory)
        for p in d.iterdir()
        if p.name.endswith(".parquet") and not p.name.startswith((".", "_")) and p.is_file()
    ]
    return sorted(files, key=lambda p: _commit_order(p.name))


def delta_files(directory: Path, version: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """Return (relative path, partition values) of a table version's data files in commit order."""
    try:
        import pyarrow as pa
        from deltalake import DeltaTable
    except ImportError as exc:
        raise ValidationConfigError(
            "reading a Delta table needs deltalake: pip install 'aiostream-ckpt[delta]'"
        ) from exc
    table = DeltaTable(str(directory), version=version)
    actions = pa.table(table.get_add_actions(flatten=True))
    parts = [c for c in actions.column_names if c.startswith("partition.")]
    out = []
    for row in actions.select(["path", *parts]).to_pylist():
        values = {c.removeprefix("partition."): row[c] for c in parts}
        out.append((unquote(str(row["path"])), values))
    return sorted(out, key=lambda f: _commit_order(f[0]))


def delta_records(
    directory: Path, version: int | None = None
) -> Iterator[tuple[dict[str, Any], str]]:
    """Yield ``(record, "file:row")`` of a Delta table's newest (or given) version."""
    import pyarrow.parquet as pq

    for relpath, partition in delta_files(directory, version):
        for n, row in enumerate(pq.read_table(directory / relpath).to_pylist(), 1):
            yield {**row, **partition}, f"{relpath}:{n}"


def parquet_records(directory: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """Yield ``(record, "file:row")`` of a directory's visible Parquet files."""
    import pyarrow.parquet as pq

    for path in parquet_files(directory):
        for n, row in enumerate(pq.read_table(path).to_pylist(), 1):
            yield row, f"{path.name}:{n}"


def table_records(directory: Path) -> Iterator[tuple[dict[str, Any], str]] | None:
    """Return the records of a Delta table or a Parquet directory; None for JSON lines."""
    if is_delta_table(directory):
        return delta_records(directory)
    if parquet_files(directory):
        return parquet_records(directory)
    return None
