"""``aiostream-ckpt checkpoints list|inspect``: what is in a checkpoint directory."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt.checkpoint.history import alignment
from aiostream_ckpt.checkpoint.metadata import METADATA_FILE, CompletedCheckpoint
from aiostream_ckpt.checkpoint.storage import CheckpointStorage, read_checkpoint
from aiostream_ckpt.errors import CheckpointError, CorruptCheckpointError


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _operator_sizes(chk: CompletedCheckpoint) -> dict[str, int]:
    return {uid: sum(subs.values()) for uid, subs in _subtask_sizes(chk).items()}


def _subtask_sizes(chk: CompletedCheckpoint) -> dict[str, dict[str, int]]:
    """Per operator, each subtask's state bytes (keyed snapshot, operator state, in flight)."""
    sizes: dict[str, dict[str, int]] = {}
    for uid, op in chk.operators.items():
        per = sizes[uid] = {}
        for sub, st in sorted(op["subtasks"].items(), key=lambda kv: int(kv[0])):
            keyed = int(st["keyed"].get("size_bytes", 0)) if st.get("keyed") else 0
            operator = len(orjson.dumps(st["operator"])) if st.get("operator") is not None else 0
            channel = int(st["channel"].get("size_bytes", 0)) if st.get("channel") else 0
            per[sub] = keyed + operator + channel
    return sizes


def _positions(chk: CompletedCheckpoint) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for op in chk.operators.values():
        for st in op["subtasks"].values():
            positions = (st.get("operator") or {}).get("positions")
            if positions:
                out.update(positions)
    return out


def _row(label: str, chk: CompletedCheckpoint, status: str) -> str:
    return (
        f"{label:>6}  {_when(chk.completion_time):19}  {chk.size_bytes:>12,}  "
        f"{chk.duration_seconds * 1000:>7.0f}ms  {status}"
    )


def savepoint_dirs(*parents: Path) -> list[Path]:
    """Savepoint directories (``savepoint-*`` with a ``_metadata``) in ``parents``, oldest first.

    A savepoint lives outside the checkpoint chain (``<checkpoint.dir>/savepoints``
    by default, or ``savepoint.dir``), so listing a checkpoint directory looks there too.
    """
    found: list[Path] = []
    for parent in parents:
        if parent.is_dir():
            found += [
                p
                for p in parent.iterdir()
                if p.name.startswith("savepoint-") and (p / METADATA_FILE).exists()
            ]
    return sorted(set(found), key=lambda p: (p.stat().st_mtime, p.name))


def list_checkpoints(directory: Path, savepoint_dir: Path | None = None) -> list[str]:
    """Completed checkpoints newest first, those set aside as bad, then the savepoints."""
    if not directory.is_dir():
        raise CheckpointError(f"not a checkpoint directory: {directory}")
    storage = CheckpointStorage(directory, create=False)
    lines = [f"{'id':>6}  {'completed (UTC)':19}  {'size':>12}  {'duration':>9}  status"]
    for cid in storage.completed_newest_first():
        try:
            chk = read_checkpoint(storage.checkpoint_dir(cid))
        except CorruptCheckpointError as exc:
            lines.append(f"{cid:>6}  {'?':19}  {'?':>12}  {'?':>9}  CORRUPT: {exc}")
            continue
        status = "completed (final)" if chk.is_final else "completed"
        how = alignment(chk)
        if how["unaligned"]:
            status += f", unaligned: {how['in_flight_records']} records in flight"
        lines.append(_row(str(cid), chk, status))
    for cid, reason in sorted(storage.set_aside_checkpoints().items(), reverse=True):
        lines.append(f"{cid:>6}  {'-':19}  {'-':>12}  {'-':>9}  set aside: {reason}")
    if len(lines) == 1:
        lines.append("(no completed checkpoints)")
    parents = [directory, directory / "savepoints"]
    if savepoint_dir is not None:
        parents.append(savepoint_dir)
    for path in reversed(savepoint_dirs(*parents)):
        try:
            chk = read_checkpoint(path)
        except CorruptCheckpointError as exc:
            lines.append(f"{'?':>6}  {'?':19}  {'?':>12}  {'?':>9}  savepoint CORRUPT: {exc}")
            continue
        lines.append(_row(str(chk.checkpoint_id), chk, f"savepoint {path}"))
    return lines


def inspect_checkpoint(directory: Path, checkpoint_id: int | None) -> dict[str, Any]:
    """Summarize one checkpoint as JSON; ``directory`` is a checkpoint root, chk-N or savepoint."""
    if (directory / "_metadata").exists():
        chk = read_checkpoint(directory)
    else:
        if not directory.is_dir():
            raise CheckpointError(f"not a checkpoint directory: {directory}")
        storage = CheckpointStorage(directory, create=False)
        if checkpoint_id is None:
            latest = storage.latest_valid()
            if latest is None:
                raise CheckpointError(f"no valid completed checkpoint in {directory}")
            chk = latest
        else:
            path = storage.checkpoint_dir(checkpoint_id)
            aside = storage.set_aside_checkpoints()
            if not path.is_dir() and checkpoint_id in aside:
                raise CheckpointError(
                    f"checkpoint {checkpoint_id} was set aside as bad: {aside[checkpoint_id]} "
                    f"(its files are in {path.name}.bad)"
                )
            if not path.is_dir():
                known = [str(cid) for cid in storage.completed_newest_first()]
                raise CheckpointError(
                    f"checkpoint {checkpoint_id} does not exist in {directory} "
                    f"(completed: {', '.join(known) or 'none'})"
                )
            chk = read_checkpoint(path)
    return {
        "id": chk.checkpoint_id,
        "savepoint": chk.is_savepoint,
        "final": chk.is_final,
        "job": chk.job_name,
        "triggered": _when(chk.trigger_time),
        "completed": _when(chk.completion_time),
        "duration_ms": round(chk.duration_seconds * 1000, 1),
        "size_bytes": chk.size_bytes,
        # aligned or unaligned, the longest alignment, what its channel state holds
        **alignment(chk),
        "max_parallelism": chk.max_parallelism,
        "operator_state_bytes": _operator_sizes(chk),
        "subtask_state_bytes": _subtask_sizes(chk),
        "operator_parallelism": {uid: op["parallelism"] for uid, op in chk.operators.items()},
        "source_positions": _positions(chk),
        # each task's ack: sync/async/alignment ms, bytes; ``worker``/``pid`` when it ran in one
        "tasks": chk.tasks,
    }
