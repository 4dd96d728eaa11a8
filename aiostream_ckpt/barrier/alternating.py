"""Aligned or unaligned, per checkpoint (Flink's ``AlternatingController``).

With ``checkpoint.unaligned=true`` a task still meets aligned barriers:
savepoints are always aligned (a savepoint is for moving a job; its state
must not depend on what was in flight). So the task's handler is both an
:class:`~.aligned.AlignedBarrierHandler` and an
:class:`~.unaligned.UnalignedBarrierHandler`, and each barrier goes to the
one its kind asks for; a barrier's kind travels with it.

The two may be busy at once, never on one channel: each upstream sends
barriers in id order, so a channel held for aligned barrier m has passed
unaligned barrier n < m, and one still collecting for n has not reached m.
Snapshots stay in id order: an unaligned barrier newer than the alignment
in progress abandons that alignment (its held elements are released and,
for the new barrier's channel, are in flight too: it overtook them), as
Flink's ``SingleCheckpointBarrierHandler`` gives up a checkpoint for a newer one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from aiostream_ckpt.barrier.aligned import AlignedBarrierHandler
from aiostream_ckpt.barrier.handler import BarrierDecision, BarrierHandler
from aiostream_ckpt.barrier.unaligned import UnalignedBarrierHandler
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier


class AlternatingBarrierHandler(BarrierHandler):
    """Sends aligned barriers to ``aligned``, unaligned ones to ``unaligned``."""

    keeps_in_flight = True

    def __init__(
        self,
        num_channels: int,
        monotonic: Callable[[], float],
        aligned: AlignedBarrierHandler,
        unaligned: UnalignedBarrierHandler,
    ) -> None:
        super().__init__(num_channels, monotonic)
        self._aligned = aligned
        self._unaligned = unaligned

    def _sync(self) -> None:
        self.holding = self._aligned.holding or self._unaligned.holding

    def is_held(self, channel: int) -> bool:
        a, u = self._aligned, self._unaligned
        return (a.holding and a.is_held(channel)) or (u.holding and u.is_held(channel))

    def hold(self, channel: int, element: Any) -> bool:
        if type(element) is CheckpointBarrier and element.unaligned:
            return False  # it overtakes any alignment: on_barrier decides
        a = self._aligned
        kept = a.hold(channel, element) if a.holding and a.is_held(channel) else False
        if not kept:
            kept = self._unaligned.hold(channel, element)
        self._sync()
        return kept

    def on_barrier(
        self, channel: int, barrier: CheckpointBarrier, in_line: Sequence[Any] = ()
    ) -> BarrierDecision | None:
        try:
            if barrier.unaligned:
                return self._on_unaligned(channel, barrier, in_line)
            collecting = self._unaligned.current
            if collecting is not None and barrier.checkpoint_id == collecting.checkpoint_id:
                return self._unaligned.on_barrier(channel, barrier, ())
            if collecting is not None and barrier.checkpoint_id < collecting.checkpoint_id:
                return None  # late
            return self._aligned.on_barrier(channel, barrier)
        finally:
            self._sync()

    def _on_unaligned(
        self, channel: int, barrier: CheckpointBarrier, in_line: Sequence[Any]
    ) -> BarrierDecision | None:
        aligning = self._aligned.current
        if aligning is None or barrier.checkpoint_id <= aligning.checkpoint_id:
            return self._unaligned.on_barrier(channel, barrier, in_line)
        # a newer unaligned barrier overtook the alignment in progress: give it up
        released = self._aligned.abort(aligning.checkpoint_id)
        overtaken = [e for c, e in released if c == channel]
        decision = self._unaligned.on_barrier(channel, barrier, [*overtaken, *in_line])
        if decision is None:
            decision = BarrierDecision(None, 0.0, [])
        decision.released = released + decision.released
        decision.abandoned = aligning.checkpoint_id
        return decision

    def abort(self, checkpoint_id: int) -> list[tuple[int, Any]]:
        released = self._aligned.abort(checkpoint_id) + self._unaligned.abort(checkpoint_id)
        self._sync()
        return released
