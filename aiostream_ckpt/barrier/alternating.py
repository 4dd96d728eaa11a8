"""Aligned or unaligned, per checkpoint (Flink's ``AlternatingController``).

With ``checkpoint.unaligned=true`` a task still meets aligned barriers:
savepoints are always aligned (a savepoint is for moving a job; its state
must not depend on what was in flight), and with ``checkpoint.aligned_timeout``
every checkpoint starts aligned. So the task's handler is both an
:class:`~.aligned.AlignedBarrierHandler` and an
:class:`~.unaligned.UnalignedBarrierHandler`, and each barrier goes to the
one its kind asks for; a barrier's kind travels with it.

An aligned checkpoint turns unaligned here (:meth:`AlternatingBarrierHandler._switch`)
when its barrier waited longer than the timeout (the task's timer, started
when the first barrier reached the gate: :meth:`on_alignment_timeout`), or
when one of its barriers comes unaligned (it turned so upstream): the task
snapshots now; the channels whose barrier came go on (what the alignment
held of them is after it), the others are collected as in flight, and the
decision has the gate move the checkpoint's barriers still in line ahead
(``prioritize``), so it completes without waiting for the queues to drain.
This is Flink's ``AlternatingWaitingForFirstBarrier`` /
``AlternatingCollectingBarriers`` -> ``...Unaligned`` on ``alignedCheckpointTimeout``.

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
    """Sends aligned barriers to ``aligned``, unaligned ones to ``unaligned``; switches."""

    keeps_in_flight = True

    def __init__(
        self,
        num_channels: int,
        monotonic: Callable[[], float],
        aligned: AlignedBarrierHandler,
        unaligned: UnalignedBarrierHandler,
        aligned_timeout: float = 0.0,
    ) -> None:
        super().__init__(num_channels, monotonic)
        self._aligned = aligned
        self._unaligned = unaligned
        #: ``checkpoint.aligned_timeout``: 0 when checkpoints are unaligned from the start
        self.aligned_timeout = aligned_timeout
        #: the newest checkpoint that turned unaligned here: its aligned barriers are late
        self._switched = 0

    def _sync(self) -> None:
        self.holding = self._aligned.holding or self._unaligned.holding

    def is_held(self, channel: int) -> bool:
        a, u = self._aligned, self._unaligned
        return (a.holding and a.is_held(channel)) or (u.holding and u.is_held(channel))

    def hold(self, channel: int, element: Any) -> bool:
        if type(element) is CheckpointBarrier and element.unaligned:
            return False  # it overtakes any alignment: on_barrier decides
        a, u = self._aligned, self._unaligned
        if a.holding and a.is_held(channel):
            kept = a.hold(channel, element)
        elif u.holding and u.is_held(channel):
            kept = u.hold(channel, element)
        else:
            kept = False
        self._sync()
        return kept

    def on_barrier(
        self, channel: int, barrier: CheckpointBarrier, in_line: Sequence[Any] = ()
    ) -> BarrierDecision | None:
        try:
            if barrier.unaligned:
                return self._on_unaligned(channel, barrier, in_line)
            cid = barrier.checkpoint_id
            collecting = self._unaligned.current
            if collecting is not None and cid == collecting.checkpoint_id:
                return self._unaligned.on_barrier(channel, barrier, ())
            if collecting is not None and cid < collecting.checkpoint_id:
                return None  # late
            if cid <= self._switched:
                return None  # it turned unaligned here, and completed
            return self._aligned.on_barrier(channel, barrier)
        finally:
            self._sync()

    def _on_unaligned(
        self, channel: int, barrier: CheckpointBarrier, in_line: Sequence[Any]
    ) -> BarrierDecision | None:
        aligning = self._aligned.current
        cid = barrier.checkpoint_id
        if aligning is not None and cid == aligning.checkpoint_id:
            # the checkpoint turned unaligned upstream: so it does here
            decision = self._switch(aligning)
            then = self._unaligned.on_barrier(channel, barrier, in_line)
            if then is not None:
                decision.in_flight = then.in_flight
            return decision
        if aligning is None or cid < aligning.checkpoint_id:
            return self._unaligned.on_barrier(channel, barrier, in_line)
        # a newer unaligned barrier overtook the alignment in progress: give it up
        released = self._aligned.abort(aligning.checkpoint_id)
        overtaken = [e for c, e in released if c == channel]
        taken = self._unaligned.on_barrier(channel, barrier, [*overtaken, *in_line])
        given_up = taken if taken is not None else BarrierDecision(None, 0.0, [])
        given_up.released = released + given_up.released
        given_up.abandoned = aligning.checkpoint_id
        return given_up

    def on_alignment_timeout(self, barrier: CheckpointBarrier) -> BarrierDecision | None:
        cid = barrier.checkpoint_id
        collecting = self._unaligned.current
        if collecting is not None and collecting.checkpoint_id >= cid:
            return None  # unaligned here already
        if cid <= self._switched or cid <= self._aligned.last_completed:
            return None  # done here before its time was up
        aligning = self._aligned.current
        if aligning is not None and aligning.checkpoint_id > cid:
            return None  # a newer checkpoint is aligning
        try:
            return self._switch(aligning if aligning is not None else barrier)
        finally:
            self._sync()

    def _switch(self, barrier: CheckpointBarrier) -> BarrierDecision:
        """Turn ``barrier``'s checkpoint unaligned here (see the module docstring)."""
        cid = barrier.checkpoint_id
        aligning = self._aligned.current
        arrived: frozenset[int] = frozenset()
        waited = self.aligned_timeout  # in line, before any barrier of it was taken
        released: list[tuple[int, Any]] = []
        abandoned = None
        if aligning is not None:
            if aligning.checkpoint_id == cid:
                arrived = self._aligned.arrived
                waited = self._monotonic() - self._aligned.started_at
            else:
                abandoned = aligning.checkpoint_id
            released = self._aligned.abort(aligning.checkpoint_id)
        decision = self._unaligned.switch(barrier, arrived, waited)
        decision.released = released
        decision.prioritize = cid
        if abandoned is not None:
            decision.abandoned = abandoned
        self._switched = cid
        return decision

    def abort(self, checkpoint_id: int) -> list[tuple[int, Any]]:
        released = self._aligned.abort(checkpoint_id) + self._unaligned.abort(checkpoint_id)
        self._sync()
        return released
