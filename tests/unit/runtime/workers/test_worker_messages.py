"""What crosses the control connection comes back as it left: acks, surveys, errors."""

from __future__ import annotations

from typing import Any

import orjson

from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier, CheckpointKind
from aiostream_ckpt.checkpoint.metadata import TaskAck
from aiostream_ckpt.connectors.base import OutputSurvey, RestoreInfo
from aiostream_ckpt.errors import (
    ConnectorError,
    CorruptCheckpointError,
    TransactionLostError,
    UserFunctionError,
    WorkerError,
)
from aiostream_ckpt.runtime.failover.restart import restartable
from aiostream_ckpt.runtime.workers.worker_messages import (
    ack_message,
    ack_of,
    barrier_message,
    barrier_of,
    error_message,
    error_of,
    restore_json,
    restore_of,
    surveys_message,
    surveys_of,
)


def wire(message: dict[str, Any]) -> dict[str, Any]:
    """As ChannelConnection.send_message and receive_message carry it."""
    decoded: dict[str, Any] = orjson.loads(orjson.dumps(message))
    return decoded


def test_checkpoint_messages_round_trip() -> None:
    barrier = CheckpointBarrier(7, 1234.5, CheckpointKind.SAVEPOINT)
    assert barrier_of(wire(barrier_message("events-1", barrier))) == barrier
    ack = TaskAck(
        task_id="pv-count-1",
        states={"pv-count": {"subtask": 1, "parallelism": 2, "keyed": {"files": ["a"]}}},
        sync_seconds=0.001,
        async_seconds=0.02,
        alignment_seconds=0.0,
        size_bytes=42,
    )
    assert ack_of(wire(ack_message(7, ack))) == ack
    surveys = [OutputSurvey("out/pv-sink", ["x"], [("part-1", 3)], 6, "kept")]
    assert surveys_of(wire(surveys_message(surveys))) == surveys
    info = RestoreInfo("checkpoint", 6, "/ckpt/chk-6", "tag", (7, 8), True)
    assert restore_of(wire({"r": restore_json(info)})["r"]) == info
    assert restore_of(None) is None


def test_a_worker_error_keeps_the_class_the_runner_decides_by() -> None:
    corrupt = error_of(wire(error_message(CorruptCheckpointError("chk-6: sha256 mismatch"))), 1)
    assert type(corrupt) is CorruptCheckpointError  # the runner sets the checkpoint aside
    assert str(corrupt) == "chk-6: sha256 mismatch"
    lost = error_of(wire(error_message(TransactionLostError("txn fenced"))), 0)
    assert type(lost) is TransactionLostError and not restartable(lost)
    user = UserFunctionError("map 'm' raised on {'k': 1}", detail="Traceback ...")
    back = error_of(wire(error_message(user)), 0)
    assert type(back) is UserFunctionError and back.retriable and back.detail == "Traceback ..."
    retriable = error_of(wire(error_message(ConnectorError("broker", retriable=True))), 0)
    assert retriable.retriable


def test_an_error_of_another_kind_names_the_worker_and_its_type() -> None:
    back = error_of(wire(error_message(RuntimeError("boom"))), 1)
    assert type(back) is WorkerError and str(back) == "worker 1: RuntimeError: boom"
    assert restartable(back)
