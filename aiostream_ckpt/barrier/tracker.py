"""At-least-once: barriers are counted, nothing is held (Flink's ``CheckpointBarrierTracker``).

The snapshot is taken when the last barrier n arrives. Records that came
after barrier n on a faster channel are already in the state, and are
replayed after a failure: duplicates, never loss. Nothing blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from aiostream_ckpt.barrier.handler import BarrierDecision, BarrierHandler
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier


class CheckpointBarrierTracker(BarrierHandler):
    """Counts barrier n on every channel; Flink's "unaligned" is something else.

    In Flink, unaligned checkpoints are exactly-once with in-flight data in the
    snapshot; this tracker is the at-least-once mode and keeps Flink's name.
    """

    def __init__(self, num_channels: int, monotonic: Callable[[], float]) -> None:
        super().__init__(num_channels, monotonic)
        self._counts: dict[int, tuple[int, float]] = {}
        self._last_completed = 0

    def is_held(self, channel: int) -> bool:
        return False

    def hold(self, channel: int, element: Any) -> bool:
        raise AssertionError("the at-least-once handler never holds")

    def on_barrier(
        self, channel: int, barrier: CheckpointBarrier, in_line: Sequence[Any] = ()
    ) -> BarrierDecision | None:
        cid = barrier.checkpoint_id
        if cid <= self._last_completed:
            return None
        count, started = self._counts.get(cid, (0, self._monotonic()))
        count += 1
        if count < self.num_channels:
            self._counts[cid] = (count, started)
            return None
        self._counts = {c: v for c, v in self._counts.items() if c > cid}
        self._last_completed = cid
        return BarrierDecision(barrier, self._monotonic() - started, [])

    def abort(self, checkpoint_id: int) -> list[tuple[int, Any]]:
        self._counts.pop(checkpoint_id, None)
        return []
