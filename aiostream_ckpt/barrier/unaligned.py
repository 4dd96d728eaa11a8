"""Exactly-once without waiting: unaligned barriers (Flink's FLIP-76).

An unaligned barrier overtakes what its channel has queued (the gate's
priority lane, ``runtime.channels``), and the task snapshots at the *first*
barrier n, holding nothing back. The records it then processes that were
sent before barrier n on their channel are not in snapshot n, so they go
into n as its *channel state*, and a restore replays them before any new
input. Per channel that is:

- what was queued in front of the barrier when it arrived (``in_line``), and
- for a channel whose barrier had not come at the snapshot, every element
  taken from it afterwards until it does (:meth:`UnalignedBarrierHandler.hold`
  notes a copy and lets the task process it).

Once barrier n has come on every channel, the decision carries the channel
state (:class:`~.handler.InFlight`). Elements are copied through ``encode``
as they are noted, before an operator could change them. A newer barrier
abandons an incomplete checkpoint (the task declines it), as Flink's
``SingleCheckpointBarrierHandler`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from aiostream_ckpt.barrier.handler import (
    AlignmentState,
    BarrierDecision,
    BarrierHandler,
    InFlight,
)
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier

#: Copies an element into the channel state; None: it belongs to none (end of input).
Encode = Callable[[Any], Any]


class UnalignedBarrierHandler(BarrierHandler):
    """Snapshots at the first barrier n; collects n's in-flight elements until the last."""

    keeps_in_flight = True

    def __init__(self, num_channels: int, monotonic: Callable[[], float], encode: Encode) -> None:
        super().__init__(num_channels, monotonic)
        self._encode = encode
        self._state = AlignmentState.IDLE
        self._current: CheckpointBarrier | None = None
        self._arrived: set[int] = set()
        self._in_flight: dict[int, list[Any]] = {}
        self._error: BaseException | None = None
        self._snapshot_at = 0.0
        self._last_done = 0

    @property
    def current(self) -> CheckpointBarrier | None:
        """The checkpoint whose in-flight elements are being collected, if any."""
        return self._current

    def _transition(self, new: AlignmentState) -> None:
        if not self._state.can_become(new):
            raise AssertionError(f"unaligned checkpoint cannot go from {self._state} to {new}")
        self._state = new

    def is_held(self, channel: int) -> bool:
        return channel not in self._arrived

    def hold(self, channel: int, element: Any) -> bool:
        if channel < 0 or type(element) is CheckpointBarrier:
            return False  # a task's own tick; a barrier, for on_barrier
        self._note(channel, (element,))
        return False

    def _note(self, channel: int, elements: Sequence[Any]) -> None:
        if self._error is not None:
            return
        out = self._in_flight[channel]
        encode = self._encode
        try:
            for element in elements:
                item = encode(element)
                if item is not None:
                    out.append(item)
        except Exception as exc:  # the checkpoint is declined, the records go on
            self._error = exc
            self._in_flight = {c: [] for c in self._in_flight}

    def on_barrier(
        self, channel: int, barrier: CheckpointBarrier, in_line: Sequence[Any] = ()
    ) -> BarrierDecision | None:
        cid = barrier.checkpoint_id
        if cid <= self._last_done:
            return None  # late: a checkpoint completed here or given up
        abandoned = None
        current = self._current
        if current is not None and cid < current.checkpoint_id:
            return None
        if current is not None and cid > current.checkpoint_id:
            abandoned = current.checkpoint_id
            self.abort(abandoned)
            current = None
        if channel in self._arrived:
            return None  # a second barrier n on one channel: nothing new
        snapshot: CheckpointBarrier | None = None
        if current is None:
            self._start(barrier)
            snapshot = barrier if barrier.unaligned else barrier.as_unaligned()
        self._arrived.add(channel)
        self._note(channel, in_line)
        decision = BarrierDecision(snapshot, 0.0, [], abandoned=abandoned)
        if len(self._arrived) == self.num_channels:
            decision.in_flight = self._complete()
        if snapshot is None and decision.in_flight is None and abandoned is None:
            return None
        return decision

    def switch(
        self, barrier: CheckpointBarrier, arrived: frozenset[int], waited: float
    ) -> BarrierDecision:
        """Take ``barrier``'s checkpoint unaligned from now: it was aligned, ``arrived`` came.

        Snapshot now; the channels in ``arrived`` passed their barrier (what the
        alignment held of them comes after it), the others are collected from here
        on as for any unaligned checkpoint (``waited``: the alignment so far).
        """
        abandoned = None
        if self._current is not None:
            abandoned = self._current.checkpoint_id
            self.abort(abandoned)
        self._start(barrier)
        self._arrived = set(arrived)
        return BarrierDecision(barrier.as_unaligned(), waited, [], abandoned=abandoned)

    def _start(self, barrier: CheckpointBarrier) -> None:
        self._transition(AlignmentState.COLLECTING)
        self._current = barrier
        self._arrived = set()
        self._in_flight = {c: [] for c in range(self.num_channels)}
        self._error = None
        self._snapshot_at = self._monotonic()
        self.holding = True

    def _complete(self) -> InFlight:
        assert self._current is not None
        done = InFlight(
            self._current.checkpoint_id,
            self._in_flight,
            self._monotonic() - self._snapshot_at,
            self._error,
        )
        self._last_done = done.checkpoint_id
        self._reset()
        return done

    def abort(self, checkpoint_id: int) -> list[tuple[int, Any]]:
        """Stop collecting ``checkpoint_id`` (nothing was held back, nothing to replay)."""
        if self._current is not None and self._current.checkpoint_id == checkpoint_id:
            self._last_done = max(self._last_done, checkpoint_id)
            self._reset()
        return []

    def _reset(self) -> None:
        self._current = None
        self._arrived = set()
        self._in_flight = {}
        self._error = None
        self.holding = False
        if self._state is not AlignmentState.IDLE:
            self._transition(AlignmentState.IDLE)
