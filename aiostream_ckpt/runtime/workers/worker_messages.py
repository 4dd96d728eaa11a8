"""What the main process and a worker say over the control connection, and how it is encoded.

Control messages are JSON objects (``ChannelConnection.send_message``), so
everything the checkpoint protocol hands across -- barriers, acks with their
state handles, output surveys, restore points, errors -- is turned into JSON
here and back, in one place both sides import.

Main -> worker: ``attempt`` (restore point, working directory), ``recover``,
``run``, ``checkpoint`` (n is triggered, and where a savepoint goes),
``trigger`` (inject barrier n at a source task), ``notify`` (n completed or
aborted; the final checkpoint's id once known), ``pins?``, ``stop``.

Worker -> main: ``hello`` (``daemon.worker``), ``surveys``, ``recovered``,
``ack``, ``decline``, ``source_finished``, ``pins``, ``metrics`` (its subtasks'
figures, ``runtime.workers.worker_metrics``), ``done``, ``failed``; and from its hello
on, ``heartbeat`` every ``job.heartbeat_interval`` (``runtime.workers.heartbeats``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from aiostream_ckpt import errors
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier, CheckpointKind
from aiostream_ckpt.checkpoint.metadata import TaskAck
from aiostream_ckpt.connectors.base import OutputSurvey, RestoreInfo
from aiostream_ckpt.errors import AiostreamError, JobFailedError, WorkerError

Message = dict[str, Any]


def barrier_message(task_id: str, barrier: CheckpointBarrier) -> Message:
    return {
        "type": "trigger",
        "task": task_id,
        "id": barrier.checkpoint_id,
        "timestamp": barrier.timestamp,
        "kind": barrier.kind.value,
        "unaligned": barrier.unaligned,
        "timeoutable": barrier.timeoutable,
    }


def barrier_of(message: Message) -> CheckpointBarrier:
    kind = CheckpointKind(message["kind"])
    unaligned, timeoutable = message["unaligned"], message["timeoutable"]
    return CheckpointBarrier(message["id"], message["timestamp"], kind, unaligned, timeoutable)


def ack_message(checkpoint_id: int, ack: TaskAck) -> Message:
    return {"type": "ack", "id": checkpoint_id, "ack": dataclasses.asdict(ack)}


def ack_of(message: Message) -> TaskAck:
    return TaskAck(**message["ack"])


def surveys_message(surveys: list[OutputSurvey]) -> Message:
    return {"type": "surveys", "surveys": [dataclasses.asdict(s) for s in surveys]}


def surveys_of(message: Message) -> list[OutputSurvey]:
    out = []
    for s in message["surveys"]:
        retract = [(str(name), int(n)) for name, n in s.pop("retract")]
        out.append(OutputSurvey(retract=retract, **s))
    return out


def restore_json(restore: RestoreInfo | None) -> dict[str, Any] | None:
    return None if restore is None else dataclasses.asdict(restore)


def restore_of(data: dict[str, Any] | None) -> RestoreInfo | None:
    if data is None:
        return None
    return RestoreInfo(**{**data, "newer": tuple(data["newer"])})


def path_or_none(value: str | None) -> Path | None:
    return None if value is None else Path(value)


def error_message(exc: BaseException) -> Message:
    """Describe a failure for the main process, keeping its class where it is ours."""
    return {
        "type": "failed",
        "kind": type(exc).__name__,
        "message": str(exc),
        "retriable": getattr(exc, "retriable", True),
        "detail": getattr(exc, "detail", "") or "",
    }


def error_of(message: Message, worker: int) -> AiostreamError:
    """Rebuild a worker's failure: the same error class when it is one of ``errors``.

    The class matters to the runner: a corrupt checkpoint is set aside, a
    refused restore ends the job, a non-retriable connector error is not restarted.
    """
    kind, text = message["kind"], message["message"]
    cls: Any = getattr(errors, kind, None)
    retriable, detail = bool(message["retriable"]), message["detail"] or None
    if isinstance(cls, type) and issubclass(cls, AiostreamError) and cls is not JobFailedError:
        try:
            rebuilt: AiostreamError = cls(text, retriable=retriable, detail=detail)
            return rebuilt
        except TypeError:  # a subclass with its own constructor
            pass
    return WorkerError(f"worker {worker}: {kind}: {text}", retriable=retriable, detail=detail)
