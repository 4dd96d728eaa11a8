"""The Delta Lake sink: exactly-once into a table Spark reads.

Two-phase commit split as Flink's Delta sink splits it: each subtask's
writer (:mod:`.writer`) writes Parquet data files at the barrier, and one
committer (:mod:`.committer`), where the coordinator runs, adds them in one
Delta commit when the checkpoint completes, with the checkpoint id as the
commit's application transaction version. A reader of the table (Spark,
delta-rs, DuckDB) sees each checkpoint's output entirely or not at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from aiostream_ckpt.connectors.arrow_records import RecordSchema, SchemaDeclaration
from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.delta.committer import DeltaCommitter
from aiostream_ckpt.connectors.delta.writer import DeltaWriter
from aiostream_ckpt.errors import ConfigError

#: 128 MiB: the file size Delta's OPTIMIZE aims at by default (delta-rs: 100 MiB).
DEFAULT_TARGET_FILE_SIZE = 128 << 20
DEFAULT_ROW_GROUP_SIZE = 64 * 1024


class DeltaSink:
    """Exactly-once output into the Delta table at ``path`` (a local directory).

    ``schema``: a pyarrow schema or a record type (:mod:`..arrow_records`);
    None infers it from the first records (the table's, once it exists, is
    enforced). A record that does not fit it goes to the dead-letter output
    with the reason; a table that exists with other columns or partition
    columns is refused at start. ``partition_by``: partition columns (Hive
    directories; the values are in the log, not the data files).
    ``target_file_size``: a data file that reaches it is closed and the
    partition goes on in a new one (each checkpoint closes them all).
    ``optimize_every``: compact the table (``OPTIMIZE``) every that many
    commits; a restore then cannot withdraw newer output and refuses instead
    (``--allow-duplicate-output`` accepts it). ``vacuum_retention_hours``
    (with ``optimize_every``): then vacuum the files compaction removed that
    are older than that; no checkpoint references them (pending data files
    are in no commit and vacuum, not in full mode, never touches them).
    ``app_id``: the commits' application id (default: ``<job>/<sink uid>``).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        name: str = "delta-sink",
        schema: SchemaDeclaration = None,
        partition_by: Sequence[str] = (),
        target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
        row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
        compression: str = "zstd",
        optimize_every: int = 0,
        vacuum_retention_hours: float | None = None,
        app_id: str | None = None,
    ) -> None:
        self.name = name
        self.uri = str(Path(path).resolve())
        declared = RecordSchema(schema, sink=name).declared  # a bad one fails at build
        self.schema = schema
        self.partition_by = list(partition_by)
        if declared is not None:
            missing = [c for c in self.partition_by if c not in declared.names]
            if missing:
                raise ConfigError(f"Delta sink {name!r}: partition columns {missing} not in schema")
            if len(self.partition_by) == len(declared.names):
                raise ConfigError(f"Delta sink {name!r}: every column is a partition column")
        if target_file_size < 1 or row_group_size < 1:
            raise ConfigError(f"Delta sink {name!r}: file and row group sizes must be positive")
        if optimize_every < 0:
            raise ConfigError(f"Delta sink {name!r}: optimize_every must not be negative")
        if vacuum_retention_hours is not None and (
            vacuum_retention_hours < 0 or not optimize_every
        ):
            raise ConfigError(
                f"Delta sink {name!r}: vacuum_retention_hours needs optimize_every and >= 0"
            )
        self.target_file_size = target_file_size
        self.row_group_size = row_group_size
        self.compression = compression
        self.optimize_every = optimize_every
        self.vacuum_retention_hours = vacuum_retention_hours
        self.app_id = app_id

    def _app_id(self, ctx: ConnectorContext) -> str:
        return self.app_id or f"{ctx.job_name}/{ctx.operator_uid}"

    def output_directories(self) -> list[Path]:
        """Own the table directory while the job runs (a second run would commit there)."""
        return [Path(self.uri)]

    def create_writer(self, ctx: ConnectorContext) -> DeltaWriter:
        if ctx.shard.sharded:
            # shards would share one table and one appId: each shard's checkpoint n would
            # look committed once another shard's n is (docs/shards.md)
            raise ConfigError(
                f"Delta sink {self.name!r}: not supported in a sharded job (--shard "
                f"{ctx.shard}) yet: the shards would commit into one table under one appId"
            )
        return DeltaWriter(self, ctx, self._app_id(ctx))

    def create_committer(self, ctx: ConnectorContext) -> DeltaCommitter:
        return DeltaCommitter(self, ctx, self._app_id(ctx))
