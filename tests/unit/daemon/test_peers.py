"""Finding the local process at the other end of a TCP connection, and outliving it.

A real server socket here and a real client in a child process: the daemon
(when it is PID 1) must find the client that asked it to stop and wait for it
to exit (see ``daemon.peers``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

from aiostream_ckpt.daemon.client import (
    EXIT_DONE,
    EXIT_STOP_INCOMPLETE,
    stop_outcome,
)
from aiostream_ckpt.daemon.peers import alive, client_pid, outlive

CLIENT = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"x")
s.recv(1)  # until the server says go
"""


def test_finds_the_client_of_a_loopback_connection_and_outlives_it() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    child = subprocess.Popen([sys.executable, "-c", CLIENT, str(port)])
    try:
        conn, peer = server.accept()
        assert conn.recv(1) == b"x"
        assert client_pid(peer, conn.getsockname()) == child.pid
        assert client_pid(("127.0.0.1", 1), conn.getsockname()) is None  # no such connection
        assert alive(child.pid)

        async def release_then_outlive() -> list[int]:
            waiting = asyncio.create_task(outlive([child.pid], grace=30))
            await asyncio.sleep(0)
            conn.sendall(b"g")  # the client exits once it has this
            left = await waiting
            child.wait()  # reaped here; a process other than its parent sees it go earlier
            return left

        assert asyncio.run(release_then_outlive()) == []
        assert not alive(child.pid)
    finally:
        child.kill()
        child.wait()
        server.close()


def test_outlive_gives_up_after_the_grace() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert asyncio.run(outlive([sleeper.pid], grace=0.05)) == [sleeper.pid]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert asyncio.run(outlive([sleeper.pid, os.getpid() + 10_000_000], grace=1)) == []


def test_the_stop_exit_code_says_what_happened(capsys) -> None:  # type: ignore[no-untyped-def]
    base = {"id": 4, "path": "/sp"}
    assert stop_outcome({**base, "job": "stopped_with_savepoint", "output_committed": True}) == 0
    assert stop_outcome({**base, "job": "finished", "output_committed": True}) == EXIT_DONE
    assert stop_outcome({**base, "job": "stopping", "output_committed": True}) == 4
    assert "the job is stopping" in capsys.readouterr().err
    assert (
        stop_outcome({**base, "job": "stopped_with_savepoint", "output_committed": False})
        == EXIT_STOP_INCOMPLETE
    )
    assert "not confirmed committed" in capsys.readouterr().err
    assert stop_outcome({**base, "job": "failed", "output_committed": True}) == 4
