"""In-memory source and sink, for tests and docstring examples.

The sink is exactly-once too: records of epoch n are kept in the writer's
checkpointed state and appended to :attr:`CollectSink.results` only when
checkpoint n completes, so a test can compare results with a failure-free run.
"""

from __future__ import annotations

from typing import Any

from aiostream_ckpt.connectors.base import ConnectorContext


class _CollectionReader:
    def __init__(self, items: list[Any], ctx: ConnectorContext) -> None:
        self._items = items
        self._ctx = ctx
        self._pos = 0
        self._split = f"collection-{ctx.subtask_index}"

    async def start(self, restored: dict[str, Any] | None) -> None:
        if restored:
            self._pos = int(restored.get(self._split, 0))
        if self._ctx.subtask_index != 0:
            self._pos = len(self._items)  # one instance reads the collection

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self._pos >= len(self._items):
            return None
        batch = self._items[self._pos : self._pos + max_records]
        self._pos += len(batch)
        return batch

    def snapshot_position(self) -> dict[str, Any]:
        return {self._split: self._pos}

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        return None

    async def close(self) -> None:
        return None


class CollectionSource:
    """A bounded, replayable source over a list."""

    bounded = True

    def __init__(self, items: list[Any], *, name: str = "collection") -> None:
        self.items = items
        self.name = name

    def create_reader(self, ctx: ConnectorContext) -> _CollectionReader:
        return _CollectionReader(self.items, ctx)


class _CollectWriter:
    def __init__(self, sink: CollectSink) -> None:
        self._sink = sink
        self._open: list[Any] = []
        self._pending: list[tuple[int, list[Any]]] = []

    async def recover(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> None:
        for cid, records in (restored or {}).get("pending", []):
            self._sink._commit(int(cid), records)

    async def write(self, batch: list[Any]) -> None:
        self._open.extend(batch)

    async def prepare_commit(self, checkpoint_id: int) -> dict[str, Any]:
        self._pending.append((checkpoint_id, self._open))
        self._open = []
        return {"pending": [[cid, recs] for cid, recs in self._pending]}

    async def commit(self, checkpoint_id: int) -> None:
        keep = []
        for cid, recs in self._pending:
            if cid <= checkpoint_id:
                self._sink._commit(cid, recs)
            else:
                keep.append((cid, recs))
        self._pending = keep

    async def close(self) -> None:
        return None


class CollectSink:
    """Collects committed records in :attr:`results` (parallelism 1)."""

    def __init__(self, *, name: str = "collect") -> None:
        self.name = name
        self.results: list[Any] = []
        self._committed: set[int] = set()

    def _commit(self, checkpoint_id: int, records: list[Any]) -> None:
        if checkpoint_id not in self._committed:
            self._committed.add(checkpoint_id)
            self.results.extend(records)

    def create_writer(self, ctx: ConnectorContext) -> _CollectWriter:
        return _CollectWriter(self)
