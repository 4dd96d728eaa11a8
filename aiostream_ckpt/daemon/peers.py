"""The process at the other end of a loopback REST connection, and outliving it.

Why: in a container the daemon is PID 1 of its PID namespace, and when PID 1
exits the kernel kills every other process of the namespace, a client run
by ``docker exec`` included. ``docker exec <c> aiostream-ckpt savepoint stop``
then exited 137 although the savepoint was taken and the job stopped (issue
#36): the daemon had answered and exited before the client had. So a daemon
that is PID 1 notes the process that asked it to stop (found, as ``ss -p``
does, through ``/proc/net/tcp`` and the processes' socket descriptors) and
waits, within a grace, for it to exit before it exits itself. A process in
another PID namespace (a client on the host) is not found and not waited
for: the daemon's exit does not touch it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Iterable

_PROC = "/proc"


def _hex(host: str, port: int) -> set[str]:
    """``/proc/net/tcp{,6}`` forms of an address (IPv4, and IPv4 mapped into IPv6)."""
    out = set()
    try:
        v4 = socket.inet_pton(socket.AF_INET, host)
        out.add(f"{struct.unpack('<I', v4)[0]:08X}:{port:04X}")
        host = f"::ffff:{host}"
    except OSError:
        pass
    try:
        v6 = socket.inet_pton(socket.AF_INET6, host)
    except OSError:
        return out
    words = struct.unpack("<4I", v6)
    out.add("".join(f"{w:08X}" for w in words) + f":{port:04X}")
    return out


def socket_inode(local: tuple[str, int], remote: tuple[str, int], proc: str = _PROC) -> int | None:
    """Return the inode of the TCP socket from ``local`` to ``remote`` (Linux), if any."""
    mine, theirs = _hex(*local), _hex(*remote)
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[1] in mine and fields[2] in theirs:
                return int(fields[9]) or None
    return None


def pid_holding(inode: int, proc: str = _PROC) -> int | None:
    """Return a process (not this one) holding socket ``inode`` open, if one is visible."""
    target = f"socket:[{inode}]"
    me = os.getpid()
    for entry in os.listdir(proc):
        if not entry.isdigit() or int(entry) == me:
            continue
        fds = f"{proc}/{entry}/fd"
        try:
            names = os.listdir(fds)
        except OSError:
            continue
        for fd in names:
            try:
                if os.readlink(f"{fds}/{fd}") == target:
                    return int(entry)
            except OSError:
                continue
    return None


def client_pid(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """Return the pid of the client connected from ``peer`` to our ``local`` address."""
    inode = socket_inode(peer, local)
    return pid_holding(inode) if inode is not None else None


def alive(pid: int, proc: str = _PROC) -> bool:
    """Whether ``pid`` runs (a zombie has exited: its status is known to its parent)."""
    try:
        with open(f"{proc}/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


async def outlive(pids: Iterable[int], grace: float, *, poll: float = 0.01) -> list[int]:
    """Wait until every process of ``pids`` exited, at most ``grace`` s; return those left."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    left = [p for p in pids if alive(p)]
    while left and loop.time() < deadline:
        await asyncio.sleep(poll)
        left = [p for p in left if alive(p)]
    return left
