"""pv_count in Kafka mode whose sink dies at the start of commit(n): the 2PC crash window.

At that point checkpoint n's metadata is durable (the coordinator notifies only
after writing it) and transaction n is pre-committed but not committed. The
process exits at once (``os._exit(137)``, as abrupt as SIGKILL: no close, no
abort), once: a marker file keeps the restarted run from crashing again.

Params on top of pv_count's: ``crash_at_commit`` (n) and ``crash_marker`` (path).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from aiostream_ckpt.connectors.kafka.sink import TransactionalKafkaWriter
from apps.pv_count import build as build_pv_count


def _first_crash(marker: str, checkpoint_id: int) -> bool:
    """Create the marker (durably) unless it exists; True if this call created it."""
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    os.write(fd, str(checkpoint_id).encode())
    os.fsync(fd)
    os.close(fd)
    return True


def build(env: Any) -> None:
    at = int(env.params["crash_at_commit"])
    marker = str(env.params["crash_marker"])
    commit = TransactionalKafkaWriter.commit

    async def crashing_commit(self: TransactionalKafkaWriter, checkpoint_id: int) -> None:
        if checkpoint_id >= at and _first_crash(marker, checkpoint_id):
            print(f"crash-window: exit before commit({checkpoint_id})", file=sys.stderr, flush=True)
            os._exit(137)
        await commit(self, checkpoint_id)

    TransactionalKafkaWriter.commit = crashing_commit  # type: ignore[method-assign]
    build_pv_count(env)
