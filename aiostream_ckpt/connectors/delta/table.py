"""What the Delta sink's writers and committer agree on: data file names, add actions, the table.

A data file's name says which sink (a tag of its application id), which
checkpoint and which subtask wrote it, so the committer can tell, from the
table directory alone, which files are its own, which checkpoint each
belongs to, and which were never committed::

    app_id=a1/part-3f9c01d2-0000000007-0001-5e0b61a4-1.parquet
              sink tag  checkpoint subtask writer  seq
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from aiostream_ckpt.errors import ConfigError, ConnectorError

try:
    import pyarrow as pa
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError
    from deltalake.transaction import AddAction
except ImportError as _exc:  # pragma: no cover - the extra is installed in dev
    raise ConfigError(
        "the Delta sink needs deltalake and pyarrow: pip install 'aiostream-ckpt[delta]'"
    ) from _exc

#: Hive's name for a null partition value, which Spark and delta-rs read back as null.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def sink_tag(app_id: str) -> str:
    """Return the 8 hex digits that mark this application id's data files."""
    return hashlib.sha256(app_id.encode()).hexdigest()[:8]


@dataclass(frozen=True, slots=True)
class DataFileNames:
    tag: str

    def name(self, checkpoint_id: int, subtask: int, writer: str, seq: int) -> str:
        return f"part-{self.tag}-{checkpoint_id:010d}-{subtask:04d}-{writer}-{seq}.parquet"

    def parse(self, name: str) -> tuple[int, int] | None:
        """(checkpoint id, subtask) of one of this sink's data files; None for any other name."""
        m = re.fullmatch(rf"part-{self.tag}-(\d{{10}})-(\d{{4}})-[0-9a-f]+-\d+\.parquet", name)
        return (int(m.group(1)), int(m.group(2))) if m else None

    def own_files(self, root: Path) -> Iterator[tuple[str, int]]:
        """Yield (relative path, checkpoint id) of this sink's data files under ``root``."""
        for parent, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
            for f in files:
                parsed = self.parse(f)
                if parsed is not None:
                    yield os.path.relpath(os.path.join(parent, f), root), parsed[0]


def partition_value(value: Any) -> str | None:
    """Delta's string form of a partition value (None for null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)


def partition_dir(columns: list[str], values: list[str | None]) -> str:
    """Hive-style directory of one partition, each value escaped as one path segment."""
    return "/".join(
        f"{c}={NULL_PARTITION if v is None else quote(v, safe='')}"
        for c, v in zip(columns, values, strict=True)
    )


def add_action(entry: dict[str, Any]) -> AddAction:
    """Return the add action of a data file as a writer state lists it."""
    return AddAction(
        str(entry["path"]),  # delta-rs URI-encodes it in the log
        int(entry["size"]),
        dict(entry.get("partition") or {}),
        int(entry["mtime_ms"]),
        True,
        f'{{"numRecords":{int(entry["records"])}}}',
    )


def table_path(entry_path: str) -> str:
    """Return a table's file path as a relative file system path (add actions are URI-encoded)."""
    return unquote(entry_path)


def open_table(uri: str) -> DeltaTable | None:
    try:
        return DeltaTable(uri)
    except TableNotFoundError:
        return None
    except Exception as exc:
        raise ConnectorError(f"cannot open the Delta table {uri}: {exc}", retriable=True) from exc


def arrow_schema(table: DeltaTable) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())


def table_files(table: DeltaTable) -> dict[str, int]:
    """Return the table's current data files (relative paths) and their record counts."""
    actions = pa.table(table.get_add_actions(flatten=True))
    paths = actions.column("path").to_pylist()
    counts = (
        actions.column("num_records").to_pylist()
        if "num_records" in actions.column_names
        else [0] * len(paths)
    )
    return {table_path(p): int(n or 0) for p, n in zip(paths, counts, strict=True)}


def transaction_version(table: DeltaTable | None, app_id: str) -> int:
    """Return the last checkpoint id committed under ``app_id`` (0: none)."""
    if table is None:
        return 0
    return int(table.transaction_version(app_id) or 0)
