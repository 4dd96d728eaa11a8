"""Watermark strategies and the per-split watermarks of a source instance.

Records carry no timestamp field through the runtime (that would cost every
operator on the hot path): a :class:`WatermarkStrategy`'s timestamp assigner
reads it from the event, at the source for watermarks and again in event-time
operators (windows) that need a record's time.

A source instance keeps one watermark per split (file, partition) and emits
the minimum over its active splits, so a fast partition cannot push event
time past a slow one. With :meth:`WatermarkStrategy.with_idleness`, a split
that produced nothing for that long (processing time, the injected clock) is
left out; when all are, the instance tells its consumers it is idle.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from aiostream_ckpt.connectors.base import (
    SourceReader,
    SplitAwareReader,
    WatermarkEmittingReader,
)
from aiostream_ckpt.durations import duration_millis
from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.runtime.elements import MIN_WATERMARK

TimestampAssigner = Callable[[Any], int]
#: milliseconds (int), a ``timedelta``, or a string with a unit (``"1m"``, as in the config)
Duration = int | timedelta | str

#: The split id of a reader that cannot tell its splits apart.
WHOLE_READER = "*"


def to_millis(duration: Duration, what: str) -> int:
    """Milliseconds of ``duration`` (an int is taken as milliseconds, ``"1m"`` as a minute)."""
    try:
        ms = duration_millis(duration)
    except ValueError as exc:
        raise ConfigError(f"{what} must be {exc}, got {duration!r}") from None
    if ms < 0:
        raise ConfigError(f"{what} must not be negative, got {duration!r}")
    return ms


@dataclass(frozen=True)
class WatermarkStrategy:
    """How a source derives event time: timestamps, watermarks, idleness.

    The watermark of a split is ``max timestamp seen - max_out_of_orderness - 1``:
    every record at most ``max_out_of_orderness`` ms older than the newest one
    is still on time.

    >>> s = WatermarkStrategy.for_bounded_out_of_orderness(5000)
    >>> s = s.with_timestamp_assigner(lambda e: e["ts"]).with_idleness(timedelta(seconds=30))
    >>> s.max_out_of_orderness_ms, s.idle_timeout_ms, s.timestamp_assigner({"ts": 7})
    (5000, 30000, 7)
    """

    max_out_of_orderness_ms: int = 0
    timestamp_assigner: TimestampAssigner | None = None
    idle_timeout_ms: int | None = None

    @staticmethod
    def for_bounded_out_of_orderness(max_delay: Duration) -> WatermarkStrategy:
        """Accept records up to ``max_delay`` (ms or timedelta) out of order."""
        return WatermarkStrategy(to_millis(max_delay, "max_delay"))

    @staticmethod
    def for_monotonous_timestamps() -> WatermarkStrategy:
        """Timestamps never decrease within a split."""
        return WatermarkStrategy(0)

    def with_timestamp_assigner(self, fn: TimestampAssigner) -> WatermarkStrategy:
        """Read a record's event time (milliseconds) with ``fn(record)``."""
        return replace(self, timestamp_assigner=fn)

    def with_idleness(self, timeout: Duration) -> WatermarkStrategy:
        """Leave a split out of the minimum after ``timeout`` without records."""
        ms = to_millis(timeout, "idle timeout")
        if ms == 0:
            raise ConfigError("idle timeout must be positive")
        return replace(self, idle_timeout_ms=ms)

    def assigner(self) -> TimestampAssigner:
        if self.timestamp_assigner is None:
            raise ConfigError(
                "the watermark strategy has no timestamp assigner: "
                "add .with_timestamp_assigner(lambda event: event['ts'])"
            )
        return self.timestamp_assigner


class _Split:
    __slots__ = ("last_active", "max_ts")

    def __init__(self, now: float) -> None:
        self.max_ts = MIN_WATERMARK
        self.last_active = now


@dataclass(frozen=True, slots=True)
class WatermarkUpdate:
    """What a task must send on: a status change (first), then a new watermark."""

    idle: bool | None = None
    watermark: int | None = None


class WatermarkStatusTracker:
    """The watermark a component last sent, and whether it declared itself idle.

    Shared by sources and the per-channel valve: given the new minimum (``None``
    when every input is idle), say what to send downstream — a status change
    first, then the advance; the watermark never goes backwards.
    """

    def __init__(self) -> None:
        self.watermark = MIN_WATERMARK
        self.idle = False

    def advance(self, low: int | None, *, silent: bool = False) -> WatermarkUpdate | None:
        """Move to ``low``; ``silent`` suppresses the idle announcement (input over)."""
        if low is None:
            if self.idle or silent:
                return None
            self.idle = True
            return WatermarkUpdate(idle=True)
        status = None
        if self.idle:
            self.idle = False
            status = False
        if low > self.watermark:
            self.watermark = low
            return WatermarkUpdate(status, low)
        return None if status is None else WatermarkUpdate(status)


class SourceWatermarks(WatermarkStatusTracker):
    """Wraps a reader: reads (per split when it can) and keeps per-split watermarks.

    Lives in the source task; ``read_batch`` replaces the reader's own, then
    :meth:`poll` after each read says what to send downstream.
    """

    def __init__(
        self,
        strategy: WatermarkStrategy,
        reader: SourceReader,
        monotonic: Callable[[], float],
    ) -> None:
        self._assign = strategy.assigner()
        self._delay = strategy.max_out_of_orderness_ms
        self._idle_after = (
            None if strategy.idle_timeout_ms is None else strategy.idle_timeout_ms / 1000
        )
        self._reader = reader
        self._split_reader = reader if isinstance(reader, SplitAwareReader) else None
        self._declared = reader if isinstance(reader, WatermarkEmittingReader) else None
        self._monotonic = monotonic
        self._splits: dict[str, _Split] = {}
        self._ended = False
        self._had_splits = False
        #: Last watermark sent; never goes backwards.
        super().__init__()

    async def read_batch(self, max_records: int) -> list[Any] | None:
        split_reader = self._split_reader
        if split_reader is None:
            batch = await self._reader.read_batch(max_records)
            if batch is None:
                self._ended = True
            elif batch:
                self._observe(WHOLE_READER, batch)
            return batch
        groups = await split_reader.read_split_batches(max_records)
        if groups is None:
            self._ended = True
            return None
        if len(groups) == 1:
            split, records = groups[0]
            self._observe(split, records)
            return records
        out: list[Any] = []
        for split, records in groups:
            self._observe(split, records)
            out.extend(records)
        return out

    def _observe(self, split: str, records: list[Any]) -> None:
        if not records:
            return
        ts = max(map(self._assign, records))
        now = self._monotonic()
        state = self._splits.get(split)
        if state is None:
            state = self._splits[split] = _Split(now)
        if ts > state.max_ts:
            state.max_ts = ts
        state.last_active = now

    def _active(self) -> Collection[str]:
        if self._split_reader is not None:
            return self._split_reader.active_splits()
        return () if self._ended else (WHOLE_READER,)

    def current(self) -> int | None:
        """Min watermark over active, non-idle splits; ``None`` when there is none."""
        now = self._monotonic()
        idle_after = self._idle_after
        active = self._active()
        if not active and self._had_splits:
            # Its splits are done and end of input is next. Going idle now would let
            # consumers run ahead while tasks between still hold timers for its records.
            return self.watermark
        self._had_splits = self._had_splits or bool(active)
        splits = self._splits
        if len(splits) > len(active):
            for gone in [s for s in splits if s not in active]:
                del splits[gone]  # finished: no longer holds the watermark
        low: int | None = None
        for split in active:
            state = splits.get(split)
            if state is None:
                state = splits[split] = _Split(now)  # idle timer starts now
            if idle_after is not None and now - state.last_active >= idle_after:
                continue
            wm = MIN_WATERMARK if state.max_ts == MIN_WATERMARK else state.max_ts - self._delay - 1
            if low is None or wm < low:
                low = wm
        return low

    def poll(self) -> WatermarkUpdate | None:
        """After a read: the status change and/or watermark advance to send, if any."""
        low = self.current()
        if self._declared is not None:
            declared = self._declared.emitted_watermark()
            if declared is not None and (low is None or declared > low):
                low = declared
        return self.advance(low)

    def snapshot(self) -> dict[str, Any]:
        """Watermark, idleness and per-split ``[max timestamp, idle]``, for the checkpoint."""
        now = self._monotonic()
        idle_after = self._idle_after
        return {
            "watermark": self.watermark,
            "idle": self.idle,
            "splits": {
                split: [
                    state.max_ts,
                    idle_after is not None and now - state.last_active >= idle_after,
                ]
                for split, state in self._splits.items()
            },
        }

    def restore(self, time: dict[str, Any]) -> None:
        """Resume from :meth:`snapshot`'s state (merged by ``time.checkpointed`` when rescaled).

        A split that was idle stays idle until it reads a record, as it would
        have without the restart, instead of waiting out the timeout again.
        """
        now = self._monotonic()
        idle_after = self._idle_after
        for split, (max_ts, idle) in (time.get("splits") or {}).items():
            state = self._splits[split] = _Split(now)
            state.max_ts = int(max_ts)
            if idle and idle_after is not None:
                state.last_active = now - idle_after
        self._had_splits = self._had_splits or bool(self._splits)
        self.watermark = int(time["watermark"])
        self.idle = bool(time.get("idle"))
