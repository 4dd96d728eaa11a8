"""The pre-barrier hook runs before any snapshot is taken and before the barrier leaves."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiostream_ckpt.aio import BackgroundTasks
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier
from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.runtime.chain import ChainSpec, TaskMetrics
from aiostream_ckpt.runtime.operators import StreamOperator
from aiostream_ckpt.runtime.subtask_checkpoint import SubtaskCheckpointCoordinator


class _Part:
    async def prepare(self) -> None:
        pass

    def write(self) -> dict[str, Any]:
        return {"size_bytes": 0}

    async def settle(self) -> None:
        pass


class _Backend:
    def __init__(self, log: list[Any], uid: str) -> None:
        self._log, self._uid = log, uid

    def snapshot(self, target: Any) -> _Part:
        self._log.append(("backend", self._uid))
        return _Part()


class _Op(StreamOperator):
    def __init__(self, uid: str, log: list[Any]) -> None:
        super().__init__(uid)
        self.log = log
        self.backend = _Backend(log, uid)  # type: ignore[assignment]

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return batch

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        self.log.append(("pre", self.uid, checkpoint_id))

    def snapshot_state(self) -> dict[str, Any] | None:
        self.log.append(("state", self.uid))
        return None


class _Responder:
    def __init__(self) -> None:
        self.acks: list[int] = []
        self.acked = asyncio.Event()

    def snapshot_target(self, cid: int, uid: str, subtask: int) -> str:
        return f"{uid}-{cid}"

    def acknowledge(self, cid: int, ack: Any) -> None:
        self.acks.append(cid)
        self.acked.set()

    def decline(self, cid: int, task_id: str, reason: BaseException) -> None:
        raise AssertionError(reason)


async def test_every_operator_flushes_before_any_snapshot_and_before_the_barrier() -> None:
    log: list[Any] = []
    ops = [_Op("a", log), _Op("b", log)]
    responder = _Responder()
    errors: list[BaseException] = []
    bg = BackgroundTasks(errors.append)

    async def broadcast(barrier: Any) -> None:
        log.append(("forward", barrier.checkpoint_id))

    executor = ThreadPoolExecutor(1)
    coordinator = SubtaskCheckpointCoordinator(
        ChainSpec(task_id="t", subtask=0, parallelism=1, operators=list(ops)),
        responder=responder,  # type: ignore[arg-type]
        finished=asyncio.get_running_loop().create_future(),
        executor=executor,
        clock=ManualClock(),
        background=bg,
        metrics=TaskMetrics(),
        broadcast=broadcast,
        time_snapshot=lambda: None,
        process_errors=None,
    )
    try:
        await coordinator.checkpoint(CheckpointBarrier(7, 0.0), 0.0, ended=False)
        await asyncio.wait_for(responder.acked.wait(), 10)  # the asynchronous part
    finally:
        await bg.cancel_all()
        executor.shutdown()
    assert not errors
    assert log[:2] == [("pre", "a", 7), ("pre", "b", 7)]
    assert log[2:] == [
        ("backend", "a"),
        ("state", "a"),
        ("backend", "b"),
        ("state", "b"),
        ("forward", 7),
    ]
    assert responder.acks == [7]
