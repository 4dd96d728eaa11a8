"""The daemon's address file: where a running daemon can be reached, for ``health``.

A health check is a separate process that sees neither the daemon's ``--set``
nor its TOML file, and ``rest.port=0`` picks a port only the daemon knows. So
the daemon publishes its effective REST address (host, port, pid, whether REST
is on) in ``rest.address_file`` (default ``<checkpoint.dir>/daemon.json``, in
the state volume of the container) once it listens, and removes it when it
exits. ``aiostream-ckpt health`` reads it; a file whose pid is no longer an
aiostream-ckpt process is stale (a daemon killed with SIGKILL leaves it).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt.checkpoint.storage import write_atomically

ADDRESS_FILE = "daemon.json"


@dataclass(frozen=True)
class DaemonAddress:
    pid: int
    rest_enabled: bool
    host: str | None = None
    port: int | None = None

    @property
    def url(self) -> str | None:
        """Where a local client reaches it: a wildcard bind is reached on loopback."""
        if not self.rest_enabled or self.port is None:
            return None
        host = self.host or "127.0.0.1"
        if host in ("0.0.0.0", "", "*"):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "rest_enabled": self.rest_enabled,
            "host": self.host,
            "port": self.port,
        }

    @classmethod
    def from_json(cls, data: Any) -> DaemonAddress:
        if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
            raise ValueError("not a daemon address")
        port = data.get("port")
        return cls(
            pid=data["pid"],
            rest_enabled=bool(data.get("rest_enabled")),
            host=data.get("host"),
            port=int(port) if port is not None else None,
        )


def publish(path: Path, address: DaemonAddress) -> None:
    """Write ``path`` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, orjson.dumps(address.to_json()))


def withdraw(path: Path, pid: int) -> None:
    """Remove ``path`` if it is still this process's (a newer daemon may own it)."""
    with contextlib.suppress(OSError, ValueError):
        if read(path).pid == pid:
            path.unlink()


def read(path: Path) -> DaemonAddress:
    """Read the published address; ``OSError`` when there is none, ``ValueError`` if garbled."""
    try:
        return DaemonAddress.from_json(orjson.loads(path.read_bytes()))
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{path} is not a daemon address file: {exc}") from None


def is_daemon_alive(pid: int) -> bool:
    """Whether ``pid`` runs aiostream-ckpt (a reused pid of another program does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, another user's
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc to tell: the pid exists
    program = any(os.path.basename(a) == b"aiostream-ckpt" for a in argv[:2])
    return (program or b"aiostream_ckpt.daemon.cli" in argv) and b"run" in argv
