"""Daemon settings: the REST endpoint, savepoint directory and SIGTERM behaviour.

These belong to the process around a job, not to the job itself, so they live
apart from :class:`~aiostream_ckpt.runtime.config.JobConfig` but are loaded by
the same layers (TOML, ``AIOSTREAM_REST__TOKEN``-style env, ``--set``).

The REST API can cancel the job and write savepoints anywhere the daemon may
write, so it listens on loopback by default, and binding any other address
without a token is refused at startup rather than left open.
"""

from __future__ import annotations

import ctypes
import gc
import ipaddress
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from aiostream_ckpt.errors import ConfigError

#: ``mallopt`` parameter number in glibc's malloc.h
_M_TRIM_THRESHOLD = -1


class ShutdownMode(Enum):
    """What SIGTERM does before the process exits 0."""

    #: finish the checkpoint in flight (if any), then stop; resume replays from it
    CANCEL = "cancel"
    #: take one more checkpoint and let the sinks commit it, then stop
    CHECKPOINT = "checkpoint"
    #: stop-with-savepoint into ``savepoint.dir``
    SAVEPOINT = "savepoint"


@dataclass(frozen=True)
class DaemonSettings:
    rest_enabled: bool = True
    rest_bind: str = "127.0.0.1"
    rest_port: int = 8081
    rest_token: str | None = None
    #: where the running daemon publishes its address (None: <checkpoint.dir>/daemon.json)
    address_file: Path | None = None
    savepoint_dir: Path | None = None
    shutdown_mode: ShutdownMode = ShutdownMode.CANCEL
    #: allocations between young-generation GC passes (Python's default is 700)
    gc_threshold: int = 50_000
    #: glibc keeps this much free memory at the top of the heap (0: its default, 128 KiB)
    malloc_trim_threshold: int = 128 << 20
    #: seconds a thread waits for the GIL before it asks for it (Python's default 0.005)
    switch_interval: float = 0.0005

    def validate(self) -> DaemonSettings:
        if not 0 <= self.rest_port <= 65535:
            raise ConfigError(f"invalid config rest.port={self.rest_port!r}: must be 0..65535")
        if self.rest_enabled and not is_loopback(self.rest_bind) and not self.rest_token:
            raise ConfigError(
                f"rest.bind={self.rest_bind!r} is not a loopback address and no rest.token "
                "is set: refusing to expose job control unauthenticated (set rest.token or "
                "AIOSTREAM_REST__TOKEN, or bind 127.0.0.1)"
            )
        return self


def is_loopback(host: str) -> bool:
    """Tell loopback (``localhost``, 127.0.0.0/8, ::1) from a wildcard, name or other address."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def parse_bool(value: Any) -> bool:
    """Parse a boolean from TOML, an env var or --set (1/true/yes/on, 0/false/no/off)."""
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError("true or false")


def _port(value: Any) -> int:
    if isinstance(value, bool) or not str(value).strip().isdigit():
        raise ValueError("a port number")
    return int(str(value))


def _mode(value: Any) -> ShutdownMode:
    try:
        return ShutdownMode(str(value).strip().lower())
    except ValueError:
        raise ValueError("one of " + ", ".join(m.value for m in ShutdownMode)) from None


def _gc_threshold(value: Any) -> int:
    if isinstance(value, bool) or not str(value).strip().isdigit() or int(str(value)) < 1:
        raise ValueError("a positive number of allocations")
    return int(str(value))


def _malloc_trim_threshold(value: Any) -> int:
    if isinstance(value, bool) or not str(value).strip().isdigit():
        raise ValueError("a number of bytes (0: glibc's default)")
    return int(str(value))


def tune_malloc(trim_threshold: int, env: Mapping[str, str] = os.environ) -> bool:
    """Let glibc keep ``trim_threshold`` bytes of freed heap instead of returning it at once.

    Every batch frees the previous batch's records; with glibc's default the
    heap is trimmed and regrown with ``brk()`` over and over, and 1 M pv_count
    events took 1.63 s of CPU instead of 1.33 s (3 runs each). Same as setting
    ``MALLOC_TRIM_THRESHOLD_``, which, when set, wins. Returns whether it was
    applied (not on a libc without ``mallopt``, e.g. musl).
    """
    if trim_threshold <= 0 or "MALLOC_TRIM_THRESHOLD_" in env:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # no such libc call; Windows: no CDLL(None)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_TRIM_THRESHOLD, min(trim_threshold, 2**31 - 1)))


def _switch_interval(value: Any) -> float:
    try:
        seconds = float(str(value).strip())
    except ValueError:
        raise ValueError("a number of seconds, e.g. 0.0005") from None
    if not 0 < seconds <= 1:
        raise ValueError("a number of seconds in (0, 1]")
    return seconds


def tune_switch_interval(seconds: float) -> None:
    """Hand the GIL to a waiting thread after ``seconds`` instead of Python's 5 ms.

    The snapshot writer and the sink's commit run in threads, and every file
    call they make gives the GIL up; taking it back from a busy event loop
    waits a whole switch interval. A delta write makes dozens of such calls,
    so with 5 ms a 100 k-key checkpoint took 545-777 ms (3 of 4 checkpoints
    of a 2 M-event pv_count run), with 1 ms 314-347 ms, with 0.5 ms 265-269 ms,
    at the same CPU time.
    """
    sys.setswitchinterval(seconds)


def tune_gc(gen0_threshold: int) -> None:
    """Set the young-generation GC threshold and freeze what startup allocated.

    A stream job keeps a few batches of records in flight, so with Python's
    default (a young pass every 700 container allocations) every pass walks
    those batches again: ~4 % of pv_count's time. Passes every 50 k
    allocations cost a tenth of that; :func:`gc.freeze` keeps the modules and
    the job graph out of the old-generation passes for good.
    """
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)
    gc.freeze()


def _token(value: Any) -> str | None:
    s = str(value).strip()
    return s or None


#: config key -> (DaemonSettings field, parser)
DAEMON_KEYS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "rest.enabled": ("rest_enabled", parse_bool),
    "rest.bind": ("rest_bind", lambda v: str(v).strip()),
    "rest.port": ("rest_port", _port),
    "rest.token": ("rest_token", _token),
    "rest.address_file": ("address_file", lambda v: Path(str(v)).expanduser()),
    "savepoint.dir": ("savepoint_dir", lambda v: Path(str(v)).expanduser()),
    "shutdown.mode": ("shutdown_mode", _mode),
    "process.gc_threshold": ("gc_threshold", _gc_threshold),
    "process.malloc_trim_threshold": ("malloc_trim_threshold", _malloc_trim_threshold),
    "process.switch_interval": ("switch_interval", _switch_interval),
}


def parse_daemon_key(key: str, raw: Any, origin: str) -> tuple[str, Any]:
    """Return ``(field, value)`` for one daemon key; :class:`ConfigError` names key and source."""
    name, parse = DAEMON_KEYS[key]
    try:
        return name, parse(raw)
    except (ValueError, TypeError) as exc:
        shown = "***" if key == "rest.token" else repr(raw)
        raise ConfigError(f"invalid config {key}={shown} (from {origin}): must be {exc}") from None
