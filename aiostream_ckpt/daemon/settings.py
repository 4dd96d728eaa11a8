"""Daemon settings: the REST endpoint, savepoint directory and SIGTERM behaviour.

These belong to the process around a job, not to the job itself, so they live
apart from :class:`~aiostream_ckpt.jobspec.config.JobConfig` but are loaded by
the same layers (TOML, ``AIOSTREAM_REST__TOKEN``-style env, ``--set``).

The REST API can cancel the job and write savepoints anywhere the daemon may
write, so it listens on loopback by default, and binding any other address
without a token is refused at startup rather than left open.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.runtime.process import ProcessProfile

_PROCESS = ProcessProfile()


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
    #: a token that reads (GET) from non-loopback peers but cannot control: for scrapers
    rest_read_token: str | None = None
    #: where the running daemon publishes its address (None: <checkpoint.dir>/daemon.json)
    address_file: Path | None = None
    savepoint_dir: Path | None = None
    shutdown_mode: ShutdownMode = ShutdownMode.CANCEL
    #: the ``process.*`` keys: see :class:`~aiostream_ckpt.runtime.process.ProcessProfile`
    gc_threshold: int = _PROCESS.gc_threshold
    malloc_trim_threshold: int = _PROCESS.malloc_trim_threshold
    switch_interval: float = _PROCESS.switch_interval

    def process_profile(self) -> ProcessProfile:
        """Return the profile the job runner applies to this process (``docs/performance.md``)."""
        return ProcessProfile(self.gc_threshold, self.malloc_trim_threshold, self.switch_interval)

    def validate(self) -> DaemonSettings:
        if not 0 <= self.rest_port <= 65535:
            raise ConfigError(f"invalid config rest.port={self.rest_port!r}: must be 0..65535")
        if self.rest_read_token and self.rest_read_token == self.rest_token:
            raise ConfigError(
                "rest.read_token equals rest.token: a read-only token must differ from the "
                "token that controls the job"
            )
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


def _switch_interval(value: Any) -> float:
    try:
        seconds = float(str(value).strip())
    except ValueError:
        raise ValueError("a number of seconds, e.g. 0.0005") from None
    if not 0 < seconds <= 1:
        raise ValueError("a number of seconds in (0, 1]")
    return seconds


def _token(value: Any) -> str | None:
    s = str(value).strip()
    return s or None


#: config key -> (DaemonSettings field, parser)
DAEMON_KEYS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "rest.enabled": ("rest_enabled", parse_bool),
    "rest.bind": ("rest_bind", lambda v: str(v).strip()),
    "rest.port": ("rest_port", _port),
    "rest.token": ("rest_token", _token),
    "rest.read_token": ("rest_read_token", _token),
    "rest.address_file": ("address_file", lambda v: Path(str(v)).expanduser()),
    "savepoint.dir": ("savepoint_dir", lambda v: Path(str(v)).expanduser()),
    "shutdown.mode": ("shutdown_mode", _mode),
    "process.gc_threshold": ("gc_threshold", _gc_threshold),
    "process.malloc_trim_threshold": ("malloc_trim_threshold", _malloc_trim_threshold),
    "process.switch_interval": ("switch_interval", _switch_interval),
}


#: keys whose values are never shown (errors, `config show`, logs)
SECRET_KEYS = frozenset({"rest.token", "rest.read_token"})


def parse_daemon_key(key: str, raw: Any, origin: str) -> tuple[str, Any]:
    """Return ``(field, value)`` for one daemon key; :class:`ConfigError` names key and source."""
    name, parse = DAEMON_KEYS[key]
    try:
        return name, parse(raw)
    except (ValueError, TypeError) as exc:
        shown = "***" if key in SECRET_KEYS else repr(raw)
        raise ConfigError(f"invalid config {key}={shown} (from {origin}): must be {exc}") from None
