"""The coordinator's checkpoints in flight, with what must end when each ends.

A pending checkpoint has companions: the future its ``trigger`` returned and
the task that expires it after ``checkpoint.timeout``. Kept apart, each end
(complete, abort, expiry) had to drop every one itself; :meth:`forget` drops
them together, so no timeout sleeps out a checkpoint that ended (60-300 idle
tasks at 1-0.2 s checkpoints, with the default 60 s timeout).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint, PendingCheckpoint


class PendingCheckpoints:
    """Pending checkpoints by id; the coordinator decides, this keeps the books."""

    def __init__(self) -> None:
        self._pending: dict[int, PendingCheckpoint] = {}
        self._waiters: dict[int, asyncio.Future[CompletedCheckpoint]] = {}
        self._expiry: dict[int, asyncio.Task[None]] = {}
        #: kept for the job's life: a task that snapshots an ended savepoint late
        #: writes into the savepoint's directory, never into a chk-N of its id
        self._savepoint_dirs: dict[int, Path] = {}

    def add(
        self, pending: PendingCheckpoint, savepoint_dir: Path | None
    ) -> asyncio.Future[CompletedCheckpoint]:
        """Keep ``pending``; return the future that resolves when it completes."""
        cid = pending.checkpoint_id
        self._pending[cid] = pending
        if savepoint_dir is not None:
            self._savepoint_dirs[cid] = savepoint_dir
        fut: asyncio.Future[CompletedCheckpoint] = asyncio.get_running_loop().create_future()
        self._waiters[cid] = fut
        return fut

    def expire_with(self, checkpoint_id: int, timeout: asyncio.Task[None]) -> None:
        """Note the task that expires ``checkpoint_id``; :meth:`forget` cancels it."""
        self._expiry[checkpoint_id] = timeout

    def get(self, checkpoint_id: int) -> PendingCheckpoint | None:
        return self._pending.get(checkpoint_id)

    def __contains__(self, checkpoint_id: int) -> bool:
        return checkpoint_id in self._pending

    def ids(self) -> list[int]:
        return sorted(self._pending)

    def regular_count(self) -> int:
        """How many checkpoints (not savepoints) are pending: ``max_concurrent`` counts these."""
        return sum(1 for p in self._pending.values() if not p.is_savepoint)

    def savepoint_count(self) -> int:
        """How many savepoints are pending."""
        return sum(1 for p in self._pending.values() if p.is_savepoint)

    def regular_before(self, checkpoint_id: int) -> list[int]:
        """Pending checkpoints (not savepoints) older than ``checkpoint_id``: it subsumes them."""
        return [c for c, p in self._pending.items() if c < checkpoint_id and not p.is_savepoint]

    def savepoint_dir(self, checkpoint_id: int) -> Path | None:
        return self._savepoint_dirs.get(checkpoint_id)

    def forget(self, checkpoint_id: int) -> None:
        """Drop an ended checkpoint and stop its timeout (unless that is what ends it)."""
        del self._pending[checkpoint_id]
        expiry = self._expiry.pop(checkpoint_id, None)
        if expiry is not None and expiry is not asyncio.current_task():
            expiry.cancel()

    def take_waiter(self, checkpoint_id: int) -> asyncio.Future[CompletedCheckpoint] | None:
        """Remove and return the future :meth:`add` returned (None once taken)."""
        return self._waiters.pop(checkpoint_id, None)
