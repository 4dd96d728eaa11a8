"""Exactly-once Parquet files: the staged-file two-phase commit with Parquet part files.

Each subtask's open transaction is one Parquet file being written, staged
under a hidden name exactly as the JSON-lines sink stages its part files
(:mod:`aiostream_ckpt.connectors.staging`): at the barrier of checkpoint n
the file gets its footer, is fsynced and renamed to its pending name; when
n completes it is renamed to ``part-<n>-<subtask>.parquet``. Recovery,
retraction and the output contract are the staging module's. A committed
file is a whole Parquet file and never changes, so Spark, pyarrow or DuckDB
may read the directory at any time (they skip the hidden staged names).

Records are mappings converted to columns under one schema
(:mod:`.arrow_records`): declared, or inferred from the first batch and
kept in the writer's checkpointed state. A record that does not fit goes to
the dead-letter output with the reason. Records are converted when written,
not when a row group is flushed, so a dead letter is committed with the
checkpoint whose source positions cover its record.

Row groups hold ``row_group_size`` rows (the last of a file fewer): batches
are converted as they come and written once that many rows are buffered,
and at the barrier. Parquet files cannot be resumed from a byte offset, so
every checkpoint closes each subtask's part file (no rolling policy).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from aiostream_ckpt.connectors.arrow_records import (
    RecordSchema,
    SchemaDeclaration,
    schema_from_state,
    schema_to_state,
)
from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.staging import (
    StagedFileWriter,
    _io_error,
    committed_files,
    merge_writer_states,
)
from aiostream_ckpt.errors import ConfigError

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError as _exc:  # pragma: no cover - the extra is installed in dev
    raise ConfigError(
        "the Parquet sink needs pyarrow: pip install 'aiostream-ckpt[parquet]'"
    ) from _exc

__all__ = ["ParquetFileSink", "ParquetStagedWriter", "read_committed_parquet"]

SUFFIX = "parquet"
#: 64 k rows: a row group of a few MB for records of a few columns, the size
#: Parquet readers split work by; smaller ones cost footer and page overhead.
DEFAULT_ROW_GROUP_SIZE = 64 * 1024


class ParquetFileSink:
    """Exactly-once Parquet output: staged part files renamed on checkpoint complete.

    ``schema``: a pyarrow schema or a record type (see :mod:`.arrow_records`);
    None infers it from the first batch. ``row_group_size``: rows per row
    group; ``compression``: any codec pyarrow writes (``zstd``, ``snappy``,
    ``none``). The directory is the job's while it runs, and a fresh start
    refuses one with committed output, as for the JSON-lines sink.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        name: str = "parquet-sink",
        schema: SchemaDeclaration = None,
        prefix: str = "part",
        row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
        compression: str = "zstd",
    ) -> None:
        if row_group_size < 1:
            raise ConfigError(f"row_group_size must be positive, got {row_group_size}")
        self.name = name
        self.directory = Path(directory)
        RecordSchema(schema, sink=name)  # a bad declaration fails when the job is built
        self.schema = schema
        self.prefix = prefix
        self.row_group_size = row_group_size
        self.compression = compression

    def output_directories(self) -> list[Path]:
        return [self.directory]

    def create_writer(self, ctx: ConnectorContext) -> ParquetStagedWriter:
        return ParquetStagedWriter(
            ctx.shard_path(self.directory),
            schema=RecordSchema(self.schema, sink=self.name),
            subtask=ctx.subtask_index,
            parallelism=ctx.parallelism,
            attempt=ctx.attempt,
            prefix=self.prefix,
            restore=ctx.restore,
            executor=ctx.executor,
            row_group_size=self.row_group_size,
            compression=self.compression,
        )


def merge_parquet_states(states: Iterable[Mapping[str, Any] | None]) -> dict[str, Any]:
    """Merge like :func:`merge_writer_states`, keeping the schema the old writers used."""
    listed = list(states)
    merged = merge_writer_states(listed)
    for state in listed:
        if state and state.get("schema"):
            merged["schema"] = state["schema"]
            break
    return merged


class ParquetStagedWriter(StagedFileWriter):
    """A :class:`StagedFileWriter` whose transaction is a Parquet file (see the module)."""

    merge_states = staticmethod(merge_parquet_states)

    def __init__(
        self,
        directory: str | Path,
        *,
        schema: RecordSchema,
        row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
        compression: str = "zstd",
        **kwargs: Any,
    ) -> None:
        super().__init__(directory, suffix=SUFFIX, **kwargs)
        self.schema = schema
        self._row_group_size = row_group_size
        self._compression = compression
        self._buffered: list[pa.Table] = []
        self._buffered_rows = 0
        self._parquet: pq.ParquetWriter | None = None

    def count_records(self, path: Path) -> int:
        return int(pq.ParquetFile(path).metadata.num_rows)

    async def recover(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> None:
        if restored and restored.get("schema") and self.schema.schema is None:
            self.schema.adopt(schema_from_state(restored["schema"]), "the restored checkpoint")
        await super().recover(restored, checkpoint_id)

    def write_sync(self, batch: list[Any]) -> None:
        """Convert ``batch`` now (dead letters go with this checkpoint); write full row groups."""
        self._check_usable()
        table = self.schema.to_table(batch, self.record_failed)
        if table is None:
            return
        self._buffered.append(table)
        self._buffered_rows += table.num_rows
        if self._buffered_rows >= self._row_group_size:
            self._write_row_groups(final=False)

    def _write_row_groups(self, *, final: bool) -> None:
        if not self._buffered_rows:
            return
        table = pa.concat_tables(self._buffered)
        n = self._row_group_size
        whole = table.num_rows if final else table.num_rows - table.num_rows % n
        if self._parquet is None:
            f = self._file or self._open_txn()
            self._parquet = pq.ParquetWriter(f, table.schema, compression=self._compression)
        try:
            self._parquet.write_table(table.slice(0, whole), row_group_size=n)
        except OSError as exc:
            staged = self._open.staged if self._open is not None else ""
            raise _io_error("write", self.directory / staged, exc) from exc
        rest = table.slice(whole)
        self._buffered = [rest] if rest.num_rows else []
        self._buffered_rows = rest.num_rows
        self.records_written += whole

    async def prepare_commit(self, checkpoint_id: int) -> dict[str, Any]:
        """Write the last row group and the footer, then pre-commit as the staging module does."""
        self._check_usable()
        self._write_row_groups(final=True)
        writer, self._parquet = self._parquet, None
        if writer is not None:
            writer.close()  # the footer; the file itself is fsynced and closed by the seal
        state = await super().prepare_commit(checkpoint_id)
        if self.schema.schema is not None:
            state["schema"] = schema_to_state(self.schema.schema)
        return state

    def request_roll(self) -> None:
        """Every checkpoint closes the part file already."""

    async def close(self) -> None:
        writer, self._parquet = self._parquet, None
        self._buffered, self._buffered_rows = [], 0
        if writer is not None:
            with contextlib.suppress(OSError):  # uncommitted: the file is discarded below
                writer.close()
        await super().close()


def committed_parquet_files(directory: str | Path, *, prefix: str = "part") -> list[Path]:
    """List the committed Parquet files of ``directory`` in commit order."""
    return committed_files(directory, prefix=prefix, suffix=SUFFIX)


def read_committed_parquet(directory: str | Path, *, prefix: str = "part") -> Iterator[Any]:
    """Yield the records (dicts) of the committed files in commit order, ignoring staged ones."""
    for path in committed_parquet_files(directory, prefix=prefix):
        yield from pq.read_table(path).to_pylist()
