"""A scripted source for app tests: records, watermarks between them, failures.

A script is a list of records with markers among them. :class:`Watermark`
moves event time forward at that point, independent of how the runtime
batches records, so a late record is late on every run (without it, a record
is late only if an earlier *batch* carried a newer timestamp, which depends on
``batch_size``). :class:`Fail` raises :class:`InjectedFailure` at that point
in the first ``attempts`` attempts of the job, so the restart and restore path
runs and the job goes on after it. :class:`Checkpoint` holds the script until
a checkpoint taken at that point completed, so a later failure restores
state from it (not from the start).

The reader's position is the index in the script, checkpointed like
:class:`~aiostream_ckpt.connectors.collection.CollectionSource`'s: after a
restore it replays exactly the records after the restored checkpoint.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.collection import _CollectionReader
from aiostream_ckpt.errors import AiostreamError


class InjectedFailure(AiostreamError):
    """The failure a :class:`Fail` marker raises (the job restarts from its checkpoint)."""


@dataclass(frozen=True, slots=True)
class Watermark:
    """Script marker: the source's watermark becomes at least ``timestamp`` (ms) here.

    Needs a watermark strategy on the source (``from_source(...,
    watermark_strategy=...)``); the source's watermark is the larger of this
    one and the strategy's.
    """

    timestamp: int


@dataclass(frozen=True, slots=True)
class Fail:
    """Script marker: raise :class:`InjectedFailure` here in the first ``attempts`` attempts."""

    attempts: int = 1
    reason: str = "injected by the test script"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Script marker: wait here until a checkpoint taken at this point is complete.

    Needs periodic checkpoints (``checkpoint.interval`` > 0; :func:`run_job`'s
    ``checkpoint_interval``). Passed at once in a later attempt that restored
    past it.
    """


_MARKERS = (Watermark, Fail, Checkpoint)


class _ScriptReader(_CollectionReader):
    def __init__(self, script: list[Any], ctx: ConnectorContext) -> None:
        super().__init__(script, ctx)
        self._attempt = ctx.attempt
        self._watermark: int | None = None
        self._covered = False  # a checkpoint was taken while waiting at a Checkpoint marker
        self._checkpointed = False  # ... and it completed

    def _at_checkpoint_marker(self) -> bool:
        items = self._items
        return self._pos < len(items) and isinstance(items[self._pos], Checkpoint)

    async def read_batch(self, max_records: int) -> list[Any] | None:
        items = self._items
        while self._pos < len(items):
            item = items[self._pos]
            if isinstance(item, Watermark):
                self._pos += 1
                if self._watermark is None or item.timestamp > self._watermark:
                    self._watermark = item.timestamp
                return []  # the task sends the watermark before the next read
            if isinstance(item, Fail):
                if self._attempt < item.attempts:
                    raise InjectedFailure(
                        f"{item.reason} (script position {self._pos}, attempt {self._attempt})"
                    )
                self._pos += 1
                continue
            if isinstance(item, Checkpoint):
                if not self._checkpointed:
                    await asyncio.sleep(0)  # let the barrier in: the task reads again at once
                    return []
                self._pos += 1
                self._covered = self._checkpointed = False
                continue
            end = self._pos
            stop = min(len(items), self._pos + max_records)
            while end < stop and not isinstance(items[end], _MARKERS):
                end += 1
            batch = items[self._pos : end]
            self._pos = end
            return batch
        return None

    def snapshot_position(self) -> dict[str, Any]:
        if self._at_checkpoint_marker():
            self._covered = True
            return {self._split: self._pos + 1}  # restored past the marker: no second wait
        return super().snapshot_position()

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        # checkpoints are notified in order and one runs at a time by default, so
        # the next completion after a snapshot at the marker is that snapshot's
        self._checkpointed = self._covered

    def emitted_watermark(self) -> int | None:
        return self._watermark


class ScriptedSource:
    """A bounded, replayable source that plays a script (parallelism 1).

    Records are read in batches (up to ``batch_size``) that end at each marker.

    >>> from aiostream_ckpt.api import StreamEnvironment
    >>> from aiostream_ckpt.testing import Fail, ScriptedSource, run_job
    >>> env = StreamEnvironment("doubled")
    >>> src = ScriptedSource([1, 2, Fail(), 3])
    >>> doubled = env.from_source(src, uid="src").map(lambda x: 2 * x, uid="double")
    >>> outputs = run_job(env, {"main": doubled})
    >>> outputs["main"], outputs.restarts
    ([2, 4, 6], 1)
    """

    bounded = True

    def __init__(self, script: Iterable[Any], *, name: str = "scripted") -> None:
        self.script = list(script)
        self.name = name

    @property
    def waits_for_checkpoints(self) -> bool:
        """Whether the script has a :class:`Checkpoint` marker (needs periodic checkpoints)."""
        return any(isinstance(item, Checkpoint) for item in self.script)

    def create_reader(self, ctx: ConnectorContext) -> _ScriptReader:
        return _ScriptReader(self.script, ctx)
