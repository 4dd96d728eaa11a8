"""A stand-in worker process for the main process's unit tests: real, but scripted.

Started by a :class:`~aiostream_ckpt.runtime.workers.worker_process.WorkerLaunch` whose
``argv`` runs this file (``python tests/apps/stub_worker.py MODE FD
FINGERPRINT``). It says hello on its control connection with no tasks, then:

- ``stubborn``: ignores SIGTERM and every message, and never exits (a worker
  whose loop is stuck): only SIGKILL ends it;
- ``forks``: forks a child that holds the control socket until the main
  process closes its end, and exits at once (code 0): no end of file comes,
  only the exit tells.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

from aiostream_ckpt.runtime.network.remote import ChannelConnection
from aiostream_ckpt.runtime.wire import batch_codec


async def main(mode: str, fd: int, fingerprint: str) -> None:
    sock = socket.socket(fileno=fd)
    conn = ChannelConnection("stub", batch_codec())
    await conn.start(sock)
    conn.send_message(
        {"type": "hello", "pid": os.getpid(), "fingerprint": fingerprint, "tasks": []}
    )
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        await asyncio.sleep(3600)
    elif mode == "forks":
        await asyncio.sleep(0.05)  # the hello is written
        if os.fork() == 0:  # the child: hold the socket until the other end closes
            child = socket.socket(fileno=os.dup(fd))
            child.setblocking(True)
            while child.recv(65536):
                pass
            os._exit(0)
        os._exit(0)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
