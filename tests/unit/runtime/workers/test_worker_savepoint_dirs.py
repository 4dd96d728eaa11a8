"""A worker acts on what the main process said, whichever socket spoke first.

The main process tells every worker where savepoint n goes (``checkpoint``
on the control connection) before it triggers any source, and has the sinks
roll (``roll``) before a stop's checkpoint. A task whose inputs all come from
another worker gets barrier n on a peer socket; under load both sockets are
read in the same loop turn, and the task runs before the control pump has
handled the message. So these are acted on at arrival: else the task writes
an incremental checkpoint snapshot (into ``chk-n`` and the shared directory)
that the savepoint's metadata cannot find, or keeps its part file open.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiostream_ckpt.checkpoint.storage import CheckpointStorage
from aiostream_ckpt.errors import CheckpointError
from aiostream_ckpt.runtime.network.remote import ChannelConnection
from aiostream_ckpt.runtime.wire import batch_codec
from aiostream_ckpt.runtime.workers.worker_attempt import WorkerCoordinator

Link = tuple[ChannelConnection, ChannelConnection, WorkerCoordinator]


@pytest.fixture
async def link(tmp_path: Path) -> AsyncIterator[Link]:
    """A worker's control connection, both ends, and the worker's coordinator on it."""
    main_sock, worker_sock = socket.socketpair()
    main = ChannelConnection("main", batch_codec())
    control = ChannelConnection("worker-1-control", batch_codec())
    await main.start(main_sock)
    await control.start(worker_sock)
    try:
        yield main, control, WorkerCoordinator(control, CheckpointStorage(tmp_path / "ckpt"), 1)
    finally:
        await main.close()
        await control.close()


async def arrived(control: ChannelConnection) -> str:
    """Wait for the next message to arrive; take it so that no pump ever handles it."""
    message = await asyncio.wait_for(control.messages.get(), 10)
    return str(message["type"])


async def test_a_savepoint_directory_is_known_once_its_message_arrived(
    tmp_path: Path, link: Link
) -> None:
    main, control, coordinator = link
    sp = tmp_path / "savepoint-7"
    main.send_message({"type": "checkpoint", "id": 7, "savepoint_dir": str(sp)})
    assert await arrived(control) == "checkpoint"

    target = coordinator.snapshot_target(7, "pv-count", 1)

    assert target.is_savepoint
    assert target.root == sp and target.exclusive_dir == sp / "pv-count-1"
    assert not (tmp_path / "ckpt" / "chk-0000000007").exists()


async def test_a_roll_reaches_the_sinks_once_its_message_arrived(
    link: Link,
) -> None:
    main, control, coordinator = link
    rolled: list[bool] = []
    coordinator.on_roll = lambda: rolled.append(True)
    main.send_message({"type": "roll"})
    assert await arrived(control) == "roll"
    assert rolled == [True]


async def test_a_worker_writes_nothing_for_a_savepoint_it_was_told_aborted(
    tmp_path: Path, link: Link
) -> None:
    """Told of the abort, the worker dropped the savepoint's directory: a task reaching
    its barrier late then wrote a chk-N of the savepoint's id into the checkpoint dir."""
    main, control, coordinator = link
    sp = tmp_path / "savepoint-7"
    main.send_message({"type": "checkpoint", "id": 7, "savepoint_dir": str(sp)})
    main.send_message({"type": "notify", "complete": False, "id": 7, "final": None})
    for _ in range(2):
        coordinator.handle(await asyncio.wait_for(control.messages.get(), 10))
    with pytest.raises(CheckpointError, match="checkpoint 7 has ended"):
        coordinator.snapshot_target(7, "pv-count", 1)  # the task declines instead
    assert not (tmp_path / "ckpt" / "chk-0000000007").exists()
    assert not sp.exists()
    # a later completion forgets it; the next checkpoints' targets are given as before
    main.send_message({"type": "notify", "complete": True, "id": 8, "final": None})
    coordinator.handle(await asyncio.wait_for(control.messages.get(), 10))
    assert coordinator.snapshot_target(9, "pv-count", 1).exclusive_dir.is_dir()
