"""Kafka bootstrap server lists, checked without the client library.

Apart from :mod:`.common` (which imports aiokafka) so that declaring a Kafka
source or sink checks its servers at once, in a process that never connects.
"""

from __future__ import annotations

import re

from aiostream_ckpt.errors import ConfigError

_HOST_PORT = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})$")


def check_bootstrap_servers(value: str) -> str:
    """Return ``value`` if it is ``host:port[,host:port...]``; else raise ``ConfigError``.

    aiokafka would raise a bare ``ValueError`` from deep in its client (or try
    port 9092 on an empty host); a config error is reported once, not retried.
    """
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"invalid Kafka bootstrap servers {value!r}: expected host:port")
    for part in value.split(","):
        m = _HOST_PORT.match(part.strip())
        if m is None or not 0 < int(m.group(1)) < 65536:
            raise ConfigError(
                f"invalid Kafka bootstrap servers {value!r}: {part.strip()!r} is not host:port"
            )
    return value
