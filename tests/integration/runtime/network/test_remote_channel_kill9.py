"""A channel to a real child process: records in order, then kill -9 of either end's peer."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier
from aiostream_ckpt.errors import ChannelError
from aiostream_ckpt.runtime.channels import InputGate
from aiostream_ckpt.runtime.elements import END_OF_INPUT
from aiostream_ckpt.runtime.network.remote import ChannelConnection, ConnectionState
from aiostream_ckpt.runtime.wire import batch_codec

pytestmark = pytest.mark.integration

#: the child: on the socket passed as fd argv[1], either produce (argv[2] == "produce":
#: 100 batches of 64 with a barrier after the 50th, end-of-input, then keep sending) or
#: consume (take nothing: the parent's sender runs out of credits)
CHILD = textwrap.dedent(
    """
    import asyncio, socket, sys
    import uvloop
    from aiostream_ckpt.runtime.channels import InputGate
    from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier
    from aiostream_ckpt.runtime.elements import END_OF_INPUT
    from aiostream_ckpt.runtime.network.remote import ChannelConnection
    from aiostream_ckpt.runtime.wire import batch_codec

    async def main() -> None:
        sock = socket.socket(fileno=int(sys.argv[1]))
        conn = ChannelConnection("child", batch_codec(), window=4)
        if sys.argv[2] == "produce":
            w = conn.writer(0)
            await conn.start(sock)
            n = 0
            for b in range(100):
                await w.send([{"k": f"key-{i % 7}", "n": n + i} for i in range(64)])
                n += 64
                if b == 49:
                    await w.send(CheckpointBarrier(1, 0.0))
            await w.send(END_OF_INPUT)
            while True:
                await w.send([{"k": "after-end", "n": -1}])
        conn.reader(0, InputGate(1, 2), index=0)
        await conn.start(sock)
        print("ready", flush=True)
        await conn.failure

    uvloop.run(main())
    """
)


def start_child(role: str) -> tuple[subprocess.Popen[bytes], socket.socket]:
    parent, child = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(child.fileno()), role],
        pass_fds=(child.fileno(),),
        stdout=subprocess.PIPE,
        env={**os.environ},
    )
    child.close()
    return proc, parent


async def test_records_in_order_then_a_killed_producer_fails_the_receiver() -> None:
    proc, sock = start_child("produce")
    try:
        gate = InputGate(1, 4)
        conn = ChannelConnection("parent", batch_codec(), window=4)
        conn.reader(0, gate, index=0)
        await conn.start(sock)
        records = []
        barrier_after = None
        while True:
            _, element = await gate.queue.get()
            if element is END_OF_INPUT:
                break
            if isinstance(element, CheckpointBarrier):
                barrier_after = len(records)
                continue
            records.extend(element)
        assert [r["n"] for r in records] == list(range(6400))
        assert barrier_after == 50 * 64
        # the child goes on sending; kill -9 it while it is suspended or sending
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

        async def drain() -> None:
            while True:
                await gate.queue.get()

        drainer = asyncio.create_task(drain())
        exc = await asyncio.wait_for(conn.failure, 60)
        drainer.cancel()
        assert isinstance(exc, ChannelError) and exc.retriable
        assert "peer process is gone" in str(exc)
        assert conn.state is ConnectionState.FAILED
        await conn.close()
    finally:
        proc.kill()
        proc.wait()
        sock.close()


async def test_a_killed_consumer_fails_the_suspended_sender() -> None:
    proc, sock = start_child("consume")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        conn = ChannelConnection("parent", batch_codec(), window=4)
        w = conn.writer(0)
        await conn.start(sock)
        sent = 0

        async def produce() -> None:
            nonlocal sent
            while True:
                await w.send([{"n": sent}])
                sent += 1

        producer = asyncio.create_task(produce())
        for _ in range(100_000):
            if w.suspended and sent == 2 + 4:  # the child's gate (2) + its credits (4)
                break
            await asyncio.sleep(0)
        assert w.suspended and w.credits == 0 and sent == 6
        os.kill(proc.pid, signal.SIGKILL)
        with pytest.raises(ChannelError, match="peer process is gone"):
            await asyncio.wait_for(producer, 60)
        assert sent == 6
        await conn.close()
    finally:
        proc.kill()
        proc.wait()
        sock.close()
