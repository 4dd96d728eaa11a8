"""A worker writes a savepoint where the main process said, whichever socket spoke first.

The main process tells every worker where savepoint n goes (``checkpoint``
on the control connection) before it triggers any source. A task whose
inputs all come from another worker gets barrier n on a peer socket; under
load both sockets are read in the same loop turn, and the task runs before
the control pump has handled the message. The directory must be known then,
or the task writes an incremental checkpoint snapshot (into ``chk-n`` and the
shared directory) that the savepoint's metadata cannot find.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from aiostream_ckpt.checkpoint.storage import CheckpointStorage
from aiostream_ckpt.runtime.remote import ChannelConnection
from aiostream_ckpt.runtime.wire import batch_codec
from aiostream_ckpt.runtime.worker_attempt import WorkerCoordinator


async def test_a_savepoint_directory_is_known_once_its_message_arrived(tmp_path: Path) -> None:
    main_sock, worker_sock = socket.socketpair()
    main = ChannelConnection("main", batch_codec())
    control = ChannelConnection("worker-1-control", batch_codec())
    await main.start(main_sock)
    await control.start(worker_sock)
    try:
        coordinator = WorkerCoordinator(control, CheckpointStorage(tmp_path / "ckpt"), 1)
        sp = tmp_path / "savepoint-7"
        main.send_message({"type": "checkpoint", "id": 7, "savepoint_dir": str(sp)})
        # it arrived; the control pump has not handled it (here: never will)
        arrived = await asyncio.wait_for(control.messages.get(), 10)
        assert arrived["type"] == "checkpoint"

        target = coordinator.snapshot_target(7, "pv-count", 1)

        assert target.is_savepoint
        assert target.root == sp and target.exclusive_dir == sp / "pv-count-1"
        assert not (tmp_path / "ckpt" / "chk-0000000007").exists()
    finally:
        await main.close()
        await control.close()


async def test_a_roll_reaches_the_sinks_once_its_message_arrived(tmp_path: Path) -> None:
    """A stop's roll, then its checkpoint: the sinks must close their part files at it."""
    main_sock, worker_sock = socket.socketpair()
    main = ChannelConnection("main", batch_codec())
    control = ChannelConnection("worker-1-control", batch_codec())
    await main.start(main_sock)
    await control.start(worker_sock)
    try:
        coordinator = WorkerCoordinator(control, CheckpointStorage(tmp_path / "ckpt"), 1)
        rolled: list[bool] = []
        coordinator.on_roll = lambda: rolled.append(True)
        main.send_message({"type": "roll"})
        arrived = await asyncio.wait_for(control.messages.get(), 10)  # the pump never runs
        assert arrived["type"] == "roll"
        assert rolled == [True]
    finally:
        await main.close()
        await control.close()
