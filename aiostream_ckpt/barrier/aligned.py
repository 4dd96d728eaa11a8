"""Exactly-once: aligned barriers.

After barrier n arrives on a channel, everything behind it on that channel is
held until barrier n has arrived on every channel; then the task snapshots and
replays the held elements first. So no record after barrier n can touch
snapshot n. The hold is bounded: past ``max_buffered_batches`` the checkpoint
is declined (as Flink's alignment limit does) and the held elements released.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from aiostream_ckpt.barrier.handler import AlignmentState, BarrierDecision, BarrierHandler
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier
from aiostream_ckpt.errors import CheckpointError


class AlignmentLimitExceeded(CheckpointError):
    """The alignment buffer grew past its bound; the checkpoint is declined."""

    retriable = True


class AlignedBarrierHandler(BarrierHandler):
    def __init__(
        self,
        num_channels: int,
        monotonic: Callable[[], float],
        max_buffered_batches: int = 1024,
    ) -> None:
        super().__init__(num_channels, monotonic)
        self._max_buffered = max_buffered_batches
        self._state = AlignmentState.IDLE
        self._current: CheckpointBarrier | None = None
        self._arrived: set[int] = set()
        self._held: list[tuple[int, Any]] = []
        self._held_batches = 0
        self._started_at = 0.0
        self._last_completed = 0

    def _transition(self, new: AlignmentState) -> None:
        if not self._state.can_become(new):
            raise CheckpointError(f"alignment cannot go from {self._state} to {new}")
        self._state = new

    def is_held(self, channel: int) -> bool:
        return channel in self._arrived

    def hold(self, channel: int, element: Any) -> bool:
        self._held.append((channel, element))
        if type(element) is list:
            self._held_batches += 1
            if self._held_batches > self._max_buffered and self._current is not None:
                cid = self._current.checkpoint_id
                raise AlignmentLimitExceeded(
                    f"checkpoint {cid}: alignment held more than {self._max_buffered} "
                    "batches; declining it"
                )
        return True

    @property
    def current(self) -> CheckpointBarrier | None:
        """The barrier being aligned, if any."""
        return self._current

    @property
    def arrived(self) -> frozenset[int]:
        """The channels whose barrier of the current alignment came."""
        return frozenset(self._arrived)

    @property
    def started_at(self) -> float:
        """When the current alignment began (the monotonic clock's reading)."""
        return self._started_at

    @property
    def last_completed(self) -> int:
        """The newest checkpoint aligned here (or given up)."""
        return self._last_completed

    def on_barrier(
        self, channel: int, barrier: CheckpointBarrier, in_line: Sequence[Any] = ()
    ) -> BarrierDecision | None:
        cid = barrier.checkpoint_id
        if cid <= self._last_completed:
            return None  # a late barrier of an aborted/subsumed checkpoint
        if self._current is None or cid > self._current.checkpoint_id:
            released = self._reset() if self._current is not None else []
            self._transition(AlignmentState.ALIGNING)
            self._current = barrier
            self._started_at = self._monotonic()
            if released:
                # A newer barrier overtook an unfinished alignment: the old one can
                # never complete here, so its held elements go back in order.
                self._arrived.add(channel)
                self.holding = True
                return BarrierDecision(None, 0.0, released)
        elif cid < self._current.checkpoint_id:
            return None
        self._arrived.add(channel)
        self.holding = True
        if len(self._arrived) < self.num_channels:
            return None
        decision = BarrierDecision(self._current, self._monotonic() - self._started_at, [])
        self._last_completed = cid
        decision.released = self._reset()
        return decision

    def abort(self, checkpoint_id: int) -> list[tuple[int, Any]]:
        if self._current is None or self._current.checkpoint_id != checkpoint_id:
            return []
        self._last_completed = max(self._last_completed, checkpoint_id)
        return self._reset()

    def _reset(self) -> list[tuple[int, Any]]:
        released = self._held
        self._held = []
        self._held_batches = 0
        self._arrived = set()
        self._current = None
        self.holding = False
        if self._state is not AlignmentState.IDLE:
            self._transition(AlignmentState.IDLE)
        return released
