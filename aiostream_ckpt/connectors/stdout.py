"""Print records as JSON lines, for development.

At-least-once: stdout cannot take back what it printed, so records replayed
after a failure are printed again. Output is flushed at every barrier so what a
checkpoint covers is visible when it completes.
"""

from __future__ import annotations

import sys
from typing import IO, Any

import orjson

from aiostream_ckpt.connectors.base import ConnectorContext, RecordErrorFn, raise_record_error
from aiostream_ckpt.connectors.staging import Serializer, serialize_each, serialize_lines


class StdoutSink:
    """Sink printing one JSON line per record to ``stream`` (default: ``sys.stdout``)."""

    def __init__(
        self,
        name: str = "stdout",
        *,
        stream: IO[bytes] | None = None,
        serializer: Serializer = orjson.dumps,
    ) -> None:
        self.name = name
        self.stream = stream
        self.serializer = serializer

    def create_writer(self, ctx: ConnectorContext) -> StdoutWriter:
        # Resolved per writer so a replaced sys.stdout (tests, daemons) is honoured.
        return StdoutWriter(self.stream or sys.stdout.buffer, self.serializer)


class StdoutWriter:
    def __init__(self, stream: IO[bytes], serializer: Serializer) -> None:
        self._stream = stream
        self._dumps = serializer
        #: see :class:`~aiostream_ckpt.connectors.base.RecordFunctions`
        self.record_failed: RecordErrorFn = raise_record_error

    async def recover(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> None:
        return None

    async def write(self, batch: list[Any]) -> None:
        if not batch:
            return
        try:
            data = serialize_lines(batch, self._dumps)
        except Exception:  # a record the serializer fails on: dead-lettered or the job fails
            batch, data = serialize_each(batch, self._dumps, self.record_failed)
        if batch:
            self._stream.write(data)

    async def prepare_commit(self, checkpoint_id: int) -> dict[str, Any]:
        self._stream.flush()
        return {}

    async def commit(self, checkpoint_id: int) -> None:
        return None

    async def close(self) -> None:
        self._stream.flush()
