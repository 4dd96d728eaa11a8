"""One subtask of the Delta sink: Parquet data files at the barrier, not yet in the table.

Records are converted when written (a record that does not fit the schema
goes to the dead-letter output then, with the checkpoint that covers it),
buffered, and written as row groups into one open Parquet file per
partition. At the barrier of checkpoint n every open file gets its footer
and is fsynced; the files go into the writer state with what their add
actions need. They are in the table directory but in no commit: Delta
readers do not see them. The sink's committer adds them when n completes;
only then is the writer told (``commit``), and it forgets them. A file
outgrowing ``target_file_size`` is closed and the partition goes on in a
new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from aiostream_ckpt import failpoints
from aiostream_ckpt.connectors.arrow_records import (
    RecordSchema,
    schema_from_state,
    schema_to_state,
)
from aiostream_ckpt.connectors.base import ConnectorContext, RecordErrorFn, raise_record_error
from aiostream_ckpt.connectors.delta.table import (
    DataFileNames,
    arrow_schema,
    open_table,
    partition_dir,
    partition_value,
    sink_tag,
)
from aiostream_ckpt.connectors.held_output import HELD_KEY, HeldCopy, keep_copy, merge_copies
from aiostream_ckpt.durable import child_path, fsync_dir
from aiostream_ckpt.errors import ConnectorError

if TYPE_CHECKING:
    from aiostream_ckpt.connectors.delta.sink import DeltaSink


@dataclass(slots=True)
class _OpenFile:
    relpath: str
    partition: dict[str, str | None]
    file: IO[bytes]
    writer: pq.ParquetWriter
    records: int = 0


def merge_delta_states(states: Iterable[Mapping[str, Any] | None]) -> dict[str, Any]:
    """Union of old writers' files (rescaling); the committer commits each file once."""
    files: dict[str, list[Any]] = {}
    schema = None
    for state in states:
        for cid, entry in (state or {}).get("files", []):
            files.setdefault(str(entry["path"]), [cid, entry])
        schema = schema or (state or {}).get("schema")
    merged: dict[str, Any] = {"files": list(files.values())}
    if schema:
        merged["schema"] = schema
    if held := merge_copies(states):
        merged[HELD_KEY] = held
    return merged


class DeltaWriter:
    """Implements :class:`~aiostream_ckpt.connectors.base.SinkWriter`; see the module docstring."""

    merge_states = staticmethod(merge_delta_states)

    def __init__(self, sink: DeltaSink, ctx: ConnectorContext, app_id: str) -> None:
        self._sink = sink
        self.subtask = ctx.subtask_index
        self._executor = ctx.executor
        self._root = Path(sink.uri)
        self._names = DataFileNames(sink_tag(app_id))
        self._token = secrets.token_hex(4)  # this writer's: names never collide across attempts
        self._seq = 0
        self.schema = RecordSchema(sink.schema, sink=sink.name)
        self._buffered: list[pa.Table] = []
        self._buffered_rows = 0
        self._open: dict[tuple[str | None, ...], _OpenFile] = {}
        #: [checkpoint id, file entry] written at barriers, not yet known to be committed
        self._pending: list[list[Any]] = []
        #: files of the checkpoint being taken (closed by size before its barrier)
        self._closed: list[dict[str, Any]] = []
        self._recovered = False
        self.records_written = 0
        #: see :class:`~aiostream_ckpt.connectors.base.RecordFunctions`
        self.record_failed: RecordErrorFn = raise_record_error

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def recover(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> None:
        """Take the table's schema (or the restored one); the committer has recovered the table.

        The committer recovered before this writer: what the restored state
        lists is in the table now and uncommitted files are gone, so nothing
        is pending.
        """
        table = await self._in_thread(open_table, self._sink.uri)
        if table is not None:
            self.schema.adopt(arrow_schema(table), f"the Delta table {self._sink.uri}")
        elif restored and restored.get("schema") and self.schema.schema is None:
            self.schema.adopt(schema_from_state(restored["schema"]), "the restored checkpoint")
        self._pending = []
        self._recovered = True

    def _check_usable(self) -> None:
        if not self._recovered:
            raise ConnectorError(f"Delta sink {self._sink.name!r}: writer used before recover()")

    async def write(self, batch: list[Any]) -> None:
        self._check_usable()
        table = self.schema.to_table(batch, self.record_failed)
        if table is None:
            return
        self._buffered.append(table)
        self._buffered_rows += table.num_rows
        if self._buffered_rows >= self._sink.row_group_size:
            self._write_buffered()

    def _write_buffered(self) -> None:
        if not self._buffered_rows:
            return
        table = pa.concat_tables(self._buffered)
        self._buffered, self._buffered_rows = [], 0
        columns = self._sink.partition_by
        if not columns:
            self._write_part((), {}, table)
            return
        keys = list(zip(*(table.column(c).to_pylist() for c in columns), strict=True))
        groups: dict[tuple[str | None, ...], list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(tuple(partition_value(v) for v in key), []).append(i)
        data = table.drop_columns(columns)  # Delta keeps partition values in the log only
        for values, rows in groups.items():
            partition = dict(zip(columns, values, strict=True))
            self._write_part(values, partition, data.take(pa.array(rows)))

    def _write_part(
        self, key: tuple[str | None, ...], partition: dict[str, str | None], table: pa.Table
    ) -> None:
        part = self._open.get(key)
        if part is None:
            part = self._open[key] = self._open_file(key, partition, table.schema)
        try:
            part.writer.write_table(table, row_group_size=self._sink.row_group_size)
        except OSError as exc:
            raise _io_error("write", self._root / part.relpath, exc) from exc
        part.records += table.num_rows
        self.records_written += table.num_rows
        if part.file.tell() >= self._sink.target_file_size:
            self._closed.append(self._close_file(self._open.pop(key)))

    def _open_file(
        self, key: tuple[str | None, ...], partition: dict[str, str | None], schema: pa.Schema
    ) -> _OpenFile:
        self._seq += 1
        # the checkpoint id is not known yet: the file is renamed at the barrier
        name = f".inprogress-{self._names.tag}-{self.subtask:04d}-{self._token}-{self._seq}"
        directory = partition_dir(self._sink.partition_by, list(key)) if key else ""
        relpath = os.path.join(directory, name) if directory else name
        path = self._root / relpath
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            f = open(path, "wb", buffering=1 << 20)  # noqa: SIM115
        except OSError as exc:
            raise _io_error("create", path, exc) from exc
        writer = pq.ParquetWriter(f, schema, compression=self._sink.compression)
        return _OpenFile(relpath, partition, f, writer)

    def _close_file(self, part: _OpenFile) -> dict[str, Any]:
        """Write the footer, fsync; return the file's entry (named for its checkpoint later)."""
        path = self._root / part.relpath
        try:
            part.writer.close()
            part.file.flush()
            os.fsync(part.file.fileno())
        except OSError as exc:
            raise _io_error("write", path, exc) from exc
        finally:
            part.file.close()
        return {"path": part.relpath, "partition": part.partition, "records": part.records}

    async def prepare_commit(self, checkpoint_id: int) -> dict[str, Any]:
        """Close every open data file, name it for ``checkpoint_id``; return the writer state."""
        self._check_usable()
        self._write_buffered()
        closing = list(self._open.values())
        self._open.clear()
        done, self._closed = self._closed, []
        entries = await self._in_thread(self._seal, done, closing, checkpoint_id)
        self._pending += [[checkpoint_id, e] for e in entries]
        if entries:
            failpoints.hit("delta_files_written")
        return self.state()

    def _seal(
        self, done: list[dict[str, Any]], closing: list[_OpenFile], checkpoint_id: int
    ) -> list[dict[str, Any]]:
        entries = done + [self._close_file(part) for part in closing]
        dirs: set[Path] = set()
        for entry in entries:
            staged = self._root / entry["path"]
            seq = int(staged.name.rsplit("-", 1)[1])
            name = self._names.name(checkpoint_id, self.subtask, self._token, seq)
            final = staged.with_name(name)
            try:
                os.rename(staged, final)
                stat = final.stat()
            except OSError as exc:
                raise _io_error("name", final, exc) from exc
            entry["path"] = str(final.relative_to(self._root))
            entry["size"] = stat.st_size
            entry["mtime_ms"] = int(stat.st_mtime * 1000)
            dirs.add(final.parent)
        for d in dirs:
            fsync_dir(d)
        return entries

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"files": [list(p) for p in self._pending]}
        if self.schema.schema is not None:
            state["schema"] = schema_to_state(self.schema.schema)
        return state

    async def hold_for_savepoint(
        self, checkpoint_id: int, state: dict[str, Any], directory: Path, root: Path
    ) -> dict[str, Any]:
        """Keep a copy (a hard link) of every data file ``state`` lists, inside the savepoint.

        A savepoint does not commit: the next checkpoint's Delta commit adds its
        files. Should the job die first, the restart deletes them as files of
        no commit; the restore of the savepoint then adds the copies
        (:class:`~aiostream_ckpt.connectors.base.SavepointHolder`).
        """
        paths = [str(entry["path"]) for _, entry in state.get("files", [])]
        if not paths:
            return state
        held = await self._in_thread(self._hold_sync, paths, directory, root)
        return {**state, HELD_KEY: [c.to_state() for c in held]}

    def _hold_sync(self, paths: list[str], directory: Path, root: Path) -> list[HeldCopy]:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            held = [
                keep_copy([self._root / rel], child_path(directory, Path(rel).name), root, rel)
                for rel in paths
            ]
            fsync_dir(directory)
        except OSError as exc:
            raise _io_error("keep a savepoint copy of", self._root, exc) from exc
        return held

    async def commit(self, checkpoint_id: int) -> None:
        """Forget the files up to ``checkpoint_id``: the committer added them before telling us."""
        self._pending = [p for p in self._pending if p[0] > checkpoint_id]

    def request_roll(self) -> None:
        """Every checkpoint closes the data files already."""

    async def close(self) -> None:
        """Drop the open files: in no checkpoint, so never committed (the next recovery agrees)."""
        for part in self._open.values():
            with contextlib.suppress(OSError):
                part.writer.close()
                part.file.close()
                (self._root / part.relpath).unlink(missing_ok=True)
        self._open.clear()
        self._buffered, self._buffered_rows = [], 0


def _io_error(what: str, path: Path, exc: OSError) -> ConnectorError:
    """Retriable: a full disk may be freed; nothing uncommitted is kept, the restore redoes it."""
    return ConnectorError(
        f"cannot {what} the Delta data file {path}: {exc.strerror or exc}", retriable=True
    )
