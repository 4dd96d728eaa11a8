"""Pending and completed checkpoints, and their on-disk metadata.

A checkpoint moves PENDING → FINALIZING (every task acked: its metadata is
being written) → COMPLETED (the metadata is durable), or to ABORTED (declined,
expired, subsumed, job stopping; from FINALIZING only when the write failed).
Only a COMPLETED checkpoint may be restored or have its transactions committed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt.errors import CheckpointError, CorruptCheckpointError

METADATA_FILE = "_metadata"
METADATA_VERSION = 1


class CheckpointStatus(Enum):
    PENDING = "pending"
    #: Every task acknowledged; the metadata is being written. Nothing aborts it now
    #: but a failed write: once durable, the next run would restore it.
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    ABORTED = "aborted"

    def can_become(self, other: CheckpointStatus) -> bool:
        if self is CheckpointStatus.PENDING:
            return other is not CheckpointStatus.PENDING
        if self is CheckpointStatus.FINALIZING:
            return other in (CheckpointStatus.COMPLETED, CheckpointStatus.ABORTED)
        return False


class AbortReason(Enum):
    DECLINED = "declined by a task"
    EXPIRED = "expired before every task acknowledged"
    SUBSUMED = "subsumed by a newer completed checkpoint"
    JOB_STOPPING = "job is stopping or failing over"
    STORAGE_FAILED = "metadata could not be written"


@dataclass(slots=True)
class TaskAck:
    """One task's acknowledgement: the state of every operator in its chain."""

    task_id: str
    #: operator uid -> {"subtask": i, "parallelism": p, "keyed": handle|None, "operator": json|None}
    #: (and "time", the task's event time; "channel", an unaligned checkpoint's in-flight records)
    states: dict[str, dict[str, Any]]
    sync_seconds: float
    async_seconds: float
    alignment_seconds: float
    size_bytes: int
    #: whether the task took it unaligned, and what it persisted of its channels'
    #: in-flight records (included in ``size_bytes``)
    unaligned: bool = False
    in_flight_bytes: int = 0
    in_flight_records: int = 0
    #: the worker process (``job.workers`` > 1) the task ran in, and its pid; None: the main one
    worker: int | None = None
    pid: int | None = None


@dataclass
class PendingCheckpoint:
    checkpoint_id: int
    is_savepoint: bool
    trigger_wall_time: float
    trigger_monotonic: float
    tasks_to_ack: set[str]
    acks: dict[str, TaskAck] = field(default_factory=dict)
    status: CheckpointStatus = CheckpointStatus.PENDING
    #: True when triggered after every source finished: completing it ends the job.
    is_final: bool = False

    def transition(self, new: CheckpointStatus) -> None:
        if not self.status.can_become(new):
            raise CheckpointError(
                f"checkpoint {self.checkpoint_id} cannot go from {self.status.value} to {new.value}"
            )
        self.status = new

    @property
    def fully_acknowledged(self) -> bool:
        return not self.tasks_to_ack

    def completed(
        self,
        job_name: str,
        max_parallelism: int,
        directory: Path,
        *,
        completion_time: float,
        duration_seconds: float,
    ) -> CompletedCheckpoint:
        """Return the metadata of this checkpoint from its acks (every task's states, by uid)."""
        operators: dict[str, dict[str, Any]] = {}
        tasks: dict[str, dict[str, Any]] = {}
        size = 0
        for ack in self.acks.values():
            size += ack.size_bytes
            tasks[ack.task_id] = {
                "sync_ms": ack.sync_seconds * 1000,
                "async_ms": ack.async_seconds * 1000,
                "alignment_ms": ack.alignment_seconds * 1000,
                "size_bytes": ack.size_bytes,
                "unaligned": ack.unaligned,
                "in_flight_bytes": ack.in_flight_bytes,
                "in_flight_records": ack.in_flight_records,
            }
            if ack.worker is not None:  # where it ran (``checkpoints inspect``)
                tasks[ack.task_id].update(worker=ack.worker, pid=ack.pid)
            for uid, st in ack.states.items():
                op = operators.setdefault(uid, {"parallelism": st["parallelism"], "subtasks": {}})
                entry = op["subtasks"][str(st["subtask"])] = {
                    "keyed": st.get("keyed"),
                    "operator": st.get("operator"),
                }
                if st.get("time") is not None:  # the task's event time (time.checkpointed)
                    entry["time"] = st["time"]
                if st.get("channel") is not None:  # in-flight records (runtime.channel_state)
                    entry["channel"] = st["channel"]
        return CompletedCheckpoint(
            checkpoint_id=self.checkpoint_id,
            is_savepoint=self.is_savepoint,
            is_final=self.is_final,
            job_name=job_name,
            trigger_time=self.trigger_wall_time,
            completion_time=completion_time,
            duration_seconds=duration_seconds,
            max_parallelism=max_parallelism,
            operators=operators,
            tasks=tasks,
            size_bytes=size,
            directory=directory,
            root=directory if self.is_savepoint else directory.parent,
        )


@dataclass
class CompletedCheckpoint:
    """A durable checkpoint; ``root`` is the directory its state files are relative to."""

    checkpoint_id: int
    is_savepoint: bool
    job_name: str
    trigger_time: float
    completion_time: float
    duration_seconds: float
    max_parallelism: int
    operators: dict[str, dict[str, Any]]
    #: task id -> its ack's figures (ms, bytes) and, from a worker, ``worker`` and ``pid``
    tasks: dict[str, dict[str, Any]]
    size_bytes: int
    directory: Path
    root: Path
    is_final: bool = False

    def subtask_states(self, uid: str) -> dict[int, dict[str, Any]]:
        op = self.operators.get(uid)
        if op is None:
            return {}
        return {int(k): v for k, v in op["subtasks"].items()}

    def referenced_files(self) -> set[str]:
        files: set[str] = set()
        for op in self.operators.values():
            for st in op["subtasks"].values():
                handle = st.get("keyed")
                if handle:
                    files.update(handle.get("files", ()))
        return files

    def to_json(self) -> dict[str, Any]:
        return {
            "version": METADATA_VERSION,
            "checkpoint_id": self.checkpoint_id,
            "is_savepoint": self.is_savepoint,
            "is_final": self.is_final,
            "job_name": self.job_name,
            "trigger_time": self.trigger_time,
            "completion_time": self.completion_time,
            "duration_seconds": self.duration_seconds,
            "max_parallelism": self.max_parallelism,
            "operators": self.operators,
            "tasks": self.tasks,
            "size_bytes": self.size_bytes,
            "root": "." if self.root == self.directory else "..",
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], directory: Path) -> CompletedCheckpoint:
        if data.get("version") != METADATA_VERSION:
            raise CorruptCheckpointError(
                f"{directory}: unsupported metadata version {data.get('version')!r}"
            )
        try:
            return cls(
                checkpoint_id=int(data["checkpoint_id"]),
                is_savepoint=bool(data["is_savepoint"]),
                is_final=bool(data.get("is_final", False)),
                job_name=str(data["job_name"]),
                trigger_time=float(data["trigger_time"]),
                completion_time=float(data["completion_time"]),
                duration_seconds=float(data["duration_seconds"]),
                max_parallelism=int(data["max_parallelism"]),
                operators=dict(data["operators"]),
                tasks=dict(data["tasks"]),
                size_bytes=int(data["size_bytes"]),
                directory=directory,
                root=directory if data["root"] == "." else directory.parent,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptCheckpointError(f"{directory}: malformed metadata ({exc!r})") from exc


def encode_metadata(body: dict[str, Any]) -> bytes:
    """Body JSON, newline, then ``sha256:<hex>`` of the body: a torn or flipped file is caught."""
    raw = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    return raw + b"\nsha256:" + hashlib.sha256(raw).hexdigest().encode() + b"\n"


def decode_metadata(data: bytes, where: Path) -> dict[str, Any]:
    raw, sep, trailer = data.rstrip(b"\n").rpartition(b"\n")
    if not sep or not trailer.startswith(b"sha256:"):
        raise CorruptCheckpointError(f"{where}: metadata has no checksum (truncated?)")
    if hashlib.sha256(raw).hexdigest().encode() != trailer[len(b"sha256:") :]:
        raise CorruptCheckpointError(f"{where}: metadata checksum mismatch")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise CorruptCheckpointError(f"{where}: metadata is not JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise CorruptCheckpointError(f"{where}: metadata is not an object")
    return body
