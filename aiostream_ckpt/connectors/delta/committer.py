"""The Delta sink's global committer: one table commit per completed checkpoint.

As Flink's ``DeltaGlobalCommitter`` does, each commit carries an application
transaction (``txn``: app id = job + sink uid, version = checkpoint id), so
the table itself says which checkpoint it holds up to. A commit of n adds
every file the writer states of n list with a checkpoint id above the
table's version (files of aborted checkpoints ride with the next one); a
repeated commit of n, after a crash between the commit and the tasks'
notification, finds the version at n and adds nothing.

Recovery, before any writer recovers, in the order that loses nothing:

1. the table's schema and partition columns must be the sink's (a table
   another writer made with other columns is refused here, at start);
2. a restore to before the version (a corrupt newest checkpoint, a savepoint
   with ``--allow-retract-output``) removes the newer checkpoints' files in
   one commit: readers of the table's newest version no longer see them,
   time travel still does (the table's ``_retracted`` move), until vacuum;
3. the restored checkpoint's files the table lacks are committed (its
   metadata was durable: it completed, whatever the crash missed): those
   above the table's version, and after a restore to before the version also
   its files that are not in the table (a savepoint's files, which a restart
   of the job deleted as files of no commit before the checkpoint after the
   savepoint added them; they come back from the savepoint's copies,
   :mod:`aiostream_ckpt.connectors.held_output`);
4. data files of this sink in no commit (written at barriers of checkpoints
   that never completed) are deleted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Schema, Transaction
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from aiostream_ckpt import failpoints
from aiostream_ckpt.aio import to_the_end
from aiostream_ckpt.connectors.arrow_records import RecordSchema, schema_from_state
from aiostream_ckpt.connectors.base import ConnectorContext, OutputSurvey, RestoreInfo
from aiostream_ckpt.connectors.delta.table import (
    DataFileNames,
    add_action,
    arrow_schema,
    open_table,
    sink_tag,
    table_files,
    transaction_version,
)
from aiostream_ckpt.connectors.held_output import copies_of, put_back, unusable
from aiostream_ckpt.errors import ConnectorError

if TYPE_CHECKING:
    from aiostream_ckpt.connectors.delta.sink import DeltaSink

log = logging.getLogger(__name__)

#: The writer states of one checkpoint, by subtask.
States = dict[int, dict[str, Any]]


def _listed(states: States, up_to: int) -> list[tuple[int, dict[str, Any]]]:
    """(checkpoint id, file entry) of every file the states list up to ``up_to``, each once."""
    seen: dict[str, tuple[int, dict[str, Any]]] = {}
    for state in states.values():
        for cid, entry in state.get("files", []):
            if int(cid) <= up_to:
                seen.setdefault(str(entry["path"]), (int(cid), entry))
    return sorted(seen.values(), key=lambda f: (f[0], str(f[1]["path"])))


class DeltaCommitter:
    """Implements :class:`~aiostream_ckpt.connectors.base.GlobalCommitter` for one Delta sink."""

    def __init__(self, sink: DeltaSink, ctx: ConnectorContext, app_id: str) -> None:
        self._sink = sink
        self.uri = sink.uri
        self.app_id = app_id
        self._names = DataFileNames(sink_tag(app_id))
        self._inprogress = re.compile(rf"\.inprogress-{self._names.tag}-\d{{4}}-[0-9a-f]+-\d+")
        self._executor: Executor | None = ctx.executor
        self._restore: RestoreInfo | None = ctx.restore
        self._job = ctx.job_name
        self._commits = 0
        self.schema = RecordSchema(sink.schema, sink=sink.name)

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        work = asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        await to_the_end(work)  # a commit half made by a cancelled attempt still ends
        return work.result()

    # -- the table -------------------------------------------------------------------

    def _check_table(self, table: DeltaTable) -> None:
        """Refuse a table whose columns or partitioning are not the sink's (step 1)."""
        self.schema.adopt(arrow_schema(table), f"the Delta table {self.uri}")
        found = list(table.metadata().partition_columns)
        if found != list(self._sink.partition_by):
            raise ConnectorError(
                f"Delta sink {self._sink.name!r}: the table {self.uri} is partitioned by "
                f"{found or 'nothing'}, the sink by {list(self._sink.partition_by) or 'nothing'}; "
                "write to another table or declare the same partition columns",
                retriable=False,
            )

    def _properties(self, checkpoint_id: int, **extra: Any) -> CommitProperties:
        meta = {"aiostream.job": self._job, "aiostream.checkpoint": checkpoint_id, **extra}
        return CommitProperties(
            app_transactions=[Transaction(app_id=self.app_id, version=checkpoint_id)],
            custom_metadata=meta,
        )

    def _file_schema(self, states: States) -> pa.Schema:
        """Return the schema a new table gets: the declared one, or the one the writers inferred."""
        if self.schema.schema is not None:
            return self.schema.schema
        found = {s["schema"] for s in states.values() if s.get("schema")}
        if len(found) > 1:
            raise ConnectorError(
                f"Delta sink {self._sink.name!r}: its subtasks inferred different schemas from "
                "their first records; declare the schema",
                retriable=False,
            )
        if not found:
            raise ConnectorError(f"Delta sink {self._sink.name!r}: no schema to create the table")
        return schema_from_state(found.pop())

    def _add(self, table: DeltaTable | None, checkpoint_id: int, states: States) -> int:
        """Commit the listed files above the table's version as checkpoint n; return how many."""
        version = transaction_version(table, self.app_id)
        todo = [(c, e) for c, e in _listed(states, checkpoint_id) if c > version]
        if checkpoint_id <= version or not todo:
            return 0
        return self._add_files(table, todo, states, checkpoint_id)

    def _restored_todo(
        self, table: DeltaTable | None, states: States, checkpoint_id: int
    ) -> list[tuple[int, dict[str, Any]]]:
        """Return the files the restored checkpoint lists that the table lacks (step 3).

        Not after compaction (``optimize_every``): a committed file may live on
        merged into another there, and going back before the version is
        refused anyway (:meth:`survey`).
        """
        version = transaction_version(table, self.app_id)
        listed = _listed(states, checkpoint_id)
        if table is not None and version > checkpoint_id and not self._sink.optimize_every:
            current = set(table_files(table))
            return [(c, e) for c, e in listed if str(e["path"]) not in current]
        return [(c, e) for c, e in listed if c > version]

    def _copy_of(self, states: States, path: str, *, verify: bool) -> tuple[Path | None, str]:
        """Return the restored savepoint's copy of data file ``path``, or why none is usable."""
        restore = self._restore
        copy = next((c for s in states.values() if (c := copies_of(s).get(path))), None)
        if restore is None or restore.kind != "savepoint" or copy is None:
            return None, ""
        root = Path(restore.path)
        why = unusable(root, copy, verify=verify)
        return (None, f" ({why})") if why is not None else (root / copy.path, "")

    def _add_files(
        self,
        table: DeltaTable | None,
        todo: list[tuple[int, dict[str, Any]]],
        states: States,
        version: int,
    ) -> int:
        """Commit ``todo`` in one Delta commit with transaction version ``version``."""
        root = Path(self.uri)
        for c, entry in todo:
            path = root / str(entry["path"])
            if not path.is_file():
                copy, why = self._copy_of(states, str(entry["path"]), verify=False)
                if copy is None:
                    raise ConnectorError(
                        f"Delta sink {self._sink.name!r}: data file {path} of checkpoint {c} "
                        f"is missing and was never committed: its records are lost{why}",
                        retriable=False,
                    )
                path.parent.mkdir(parents=True, exist_ok=True)
                put_back(copy, path.parent, path.name)
                log.info(
                    "%s: data file %s of checkpoint %d, listed by the restored savepoint, was "
                    "gone; brought back from the savepoint's copy %s",
                    self.uri,
                    entry["path"],
                    c,
                    copy,
                )
        adds = [add_action(e) for _, e in todo]
        failpoints.hit("delta_commit")
        if table is None:
            schema = self._file_schema(states)
            create_table_with_add_actions(
                self.uri,
                _delta_schema(schema),
                adds,
                mode="error",
                partition_by=list(self._sink.partition_by) or None,
                commit_properties=self._properties(version),
            )
        else:
            actions: list[AddAction | RemoveAction] = [*adds]
            table.create_write_transaction(
                actions,
                mode="append",
                schema=table.schema(),
                partition_by=list(self._sink.partition_by) or None,
                commit_properties=self._properties(version),
            )
        failpoints.hit("delta_committed")
        return len(adds)

    # -- GlobalCommitter ---------------------------------------------------------------

    def survey(self, states: States, checkpoint_id: int | None) -> OutputSurvey:
        table = open_table(self.uri)
        version = transaction_version(table, self.app_id)
        root = Path(self.uri)
        lost = []
        if checkpoint_id:
            for _, entry in self._restored_todo(table, states, checkpoint_id):
                if not (root / str(entry["path"])).is_file():
                    copy, why = self._copy_of(states, str(entry["path"]), verify=True)
                    if copy is None:
                        lost.append(f"{entry['path']}{why}")
        retract: list[tuple[str, int]] = []
        kept = ""
        if checkpoint_id is None and version:
            kept = (
                f"the Delta table {self.uri} holds the output of checkpoints up to {version} "
                f"of this sink (app id {self.app_id!r}) from an earlier run"
            )
        elif checkpoint_id is not None and version > checkpoint_id and table is not None:
            if self._sink.optimize_every:
                kept = (
                    f"the Delta table {self.uri} holds the output of checkpoints "
                    f"{checkpoint_id + 1}..{version}, which compaction may have merged into "
                    "older files, so it cannot be withdrawn"
                )
            else:
                retract = self._newer_files(table, checkpoint_id)
        own = [c for _, c in self._names.own_files(root)] if root.is_dir() else []
        return OutputSurvey(self.uri, lost, retract, max([version, *own]), kept)

    def _newer_files(self, table: DeltaTable, checkpoint_id: int) -> list[tuple[str, int]]:
        out = []
        for path, records in table_files(table).items():
            parsed = self._names.parse(os.path.basename(path))
            if parsed is not None and parsed[0] > checkpoint_id:
                out.append((path, records))
        return sorted(out)

    async def recover(self, states: States, checkpoint_id: int | None) -> None:
        await self._in_thread(self._recover_sync, states, checkpoint_id)

    def _recover_sync(self, states: States, checkpoint_id: int | None) -> None:
        table = open_table(self.uri)
        if table is not None:
            self._check_table(table)
        elif self.schema.declared is not None:  # readers see the (empty) table at once
            Path(self.uri).mkdir(parents=True, exist_ok=True)
            DeltaTable.create(
                self.uri,
                _delta_schema(self.schema.declared),
                mode="ignore",
                partition_by=list(self._sink.partition_by) or None,
            )
            table = open_table(self.uri)
        version = transaction_version(table, self.app_id)
        if table is not None and checkpoint_id is not None and version > checkpoint_id:
            self._retract(table, checkpoint_id, version)  # 2.
            table = open_table(self.uri)
        if checkpoint_id:  # 3. the restored checkpoint completed: its files go in
            todo = self._restored_todo(table, states, checkpoint_id)
            if todo:  # the version never goes back: the next checkpoints' ids go above it
                added = self._add_files(table, todo, states, max(version, checkpoint_id))
                log.info(
                    "%s: committed the %d data file(s) of restored checkpoint %d",
                    self.uri,
                    added,
                    checkpoint_id,
                )
                table = open_table(self.uri)
        self._remove_uncommitted(table)  # 4.

    def _retract(self, table: DeltaTable, checkpoint_id: int, version: int) -> None:
        newer = self._newer_files(table, checkpoint_id)
        if not newer:
            return
        now = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [RemoveAction(p, True, now) for p, _ in newer]
        why = (
            f"committed after the restored checkpoint {checkpoint_id}: the job was restored to a "
            "point before this output and produces its records again from there"
        )
        restore = self._restore.to_json() if self._restore is not None else {"id": checkpoint_id}
        table.create_write_transaction(
            actions,
            mode="append",
            schema=table.schema(),
            partition_by=list(self._sink.partition_by) or None,
            commit_properties=self._properties(
                version, **{"aiostream.retracted": why, "aiostream.restored": str(restore)}
            ),
        )
        log.warning(
            "%s: retracted %d committed record(s) in %d data file(s) of checkpoints %d..%d (a "
            "Delta commit removing them; time travel still reads them until vacuum)",
            self.uri,
            sum(n for _, n in newer),
            len(newer),
            checkpoint_id + 1,
            version,
        )

    def _remove_uncommitted(self, table: DeltaTable | None) -> None:
        """Delete this sink's data files in no commit, and its in-progress files (step 4)."""
        root = Path(self.uri)
        if not root.is_dir():
            return
        version = transaction_version(table, self.app_id)
        current = set(table_files(table)) if table is not None else set()
        removed = 0
        for relpath, cid in self._names.own_files(root):
            if cid > version and relpath not in current:
                (root / relpath).unlink(missing_ok=True)
                removed += 1
        for parent, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
            for f in files:
                if self._inprogress.fullmatch(f):
                    Path(parent, f).unlink(missing_ok=True)
                    removed += 1
        if removed:
            log.info("%s: deleted %d data file(s) of unfinished checkpoints", root, removed)

    async def commit(self, checkpoint_id: int, states: States) -> None:
        await self._in_thread(self._commit_sync, checkpoint_id, states)

    def _commit_sync(self, checkpoint_id: int, states: States) -> None:
        table = open_table(self.uri)
        if self._add(table, checkpoint_id, states) == 0:
            return
        self._commits += 1
        sink = self._sink
        if sink.optimize_every and self._commits % sink.optimize_every == 0:
            table = open_table(self.uri)
            assert table is not None
            table.optimize.compact(target_size=sink.target_file_size)
            if sink.vacuum_retention_hours is not None:
                table.vacuum(
                    retention_hours=int(sink.vacuum_retention_hours),
                    dry_run=False,
                    enforce_retention_duration=False,
                    full=False,  # only files commits removed: never a pending data file
                )

    async def close(self) -> None:
        return None


def _delta_schema(schema: pa.Schema) -> Schema:
    return Schema.from_arrow(schema)
