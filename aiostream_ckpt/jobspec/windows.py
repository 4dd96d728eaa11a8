"""Event-time windows: what a window is, which windows a record belongs to.

A :class:`TimeWindow` is a plain ``(start, end)`` tuple (end exclusive), so it
is its own state key: it serializes to a JSON array and comes back as a tuple.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import NamedTuple

from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.jobspec.watermarks import Duration, to_millis


class TimeWindow(NamedTuple):
    """Event time ``[start, end)`` in milliseconds."""

    start: int
    end: int

    @property
    def max_timestamp(self) -> int:
        """The last millisecond in the window: it fires when the watermark reaches it."""
        return self.end - 1

    def intersects(self, other: tuple[int, int]) -> bool:
        """Overlapping or touching (Flink's rule: such sessions merge)."""
        return self.start <= other[1] and other[0] <= self.end

    def cover(self, other: tuple[int, int]) -> TimeWindow:
        return TimeWindow(min(self.start, other[0]), max(self.end, other[1]))


def window_start(timestamp: int, offset: int, size: int) -> int:
    """Start of the size-aligned window holding ``timestamp`` (Flink's getWindowStartWithOffset)."""
    return timestamp - (timestamp - offset + size) % size


class WindowAssigner(ABC):
    """Maps a record's timestamp to the windows it belongs to."""

    #: True for session windows: windows of a key merge when they touch.
    merging = False

    @abstractmethod
    def assign(self, timestamp: int) -> list[TimeWindow]: ...

    def bounds(self, timestamp: int) -> Sequence[tuple[int, int]]:
        """Return :meth:`assign`'s windows as plain ``(start, end)`` tuples (per record)."""
        return [(w.start, w.end) for w in self.assign(timestamp)]


class TumblingEventTimeWindows(WindowAssigner):
    """Fixed, non-overlapping windows of ``size``.

    >>> TumblingEventTimeWindows.of(3_600_000).assign(5_400_000)
    [TimeWindow(start=3600000, end=7200000)]
    """

    def __init__(self, size: int, offset: int) -> None:
        if size <= 0:
            raise ConfigError(f"window size must be positive, got {size}")
        self.size = size
        self.offset = offset % size

    @staticmethod
    def of(size: Duration, offset: Duration = 0) -> TumblingEventTimeWindows:
        return TumblingEventTimeWindows(
            to_millis(size, "window size"), to_millis(offset, "window offset")
        )

    def assign(self, timestamp: int) -> list[TimeWindow]:
        start = window_start(timestamp, self.offset, self.size)
        return [TimeWindow(start, start + self.size)]

    def bounds(self, timestamp: int) -> Sequence[tuple[int, int]]:
        size = self.size
        start = timestamp - (timestamp - self.offset + size) % size  # window_start, inlined
        return ((start, start + size),)


class SlidingEventTimeWindows(WindowAssigner):
    """Windows of ``size`` starting every ``slide``; a record is in ``size / slide`` of them.

    >>> SlidingEventTimeWindows.of(10, 5).assign(12)
    [TimeWindow(start=10, end=20), TimeWindow(start=5, end=15)]
    """

    def __init__(self, size: int, slide: int, offset: int) -> None:
        if size <= 0 or slide <= 0:
            raise ConfigError(f"window size and slide must be positive, got {size}, {slide}")
        self.size = size
        self.slide = slide
        self.offset = offset % slide

    @staticmethod
    def of(size: Duration, slide: Duration, offset: Duration = 0) -> SlidingEventTimeWindows:
        return SlidingEventTimeWindows(
            to_millis(size, "window size"),
            to_millis(slide, "window slide"),
            to_millis(offset, "window offset"),
        )

    def assign(self, timestamp: int) -> list[TimeWindow]:
        last = window_start(timestamp, self.offset, self.slide)
        return [
            TimeWindow(start, start + self.size)
            for start in range(last, timestamp - self.size, -self.slide)
        ]


class EventTimeSessionWindows(WindowAssigner):
    """Per-key sessions: records less than ``gap`` apart belong to one window.

    Each record starts as ``[ts, ts + gap)``; windows of a key that touch merge.

    >>> EventTimeSessionWindows.with_gap(30_000).assign(1_000)
    [TimeWindow(start=1000, end=31000)]
    """

    merging = True

    def __init__(self, gap: int) -> None:
        if gap <= 0:
            raise ConfigError(f"session gap must be positive, got {gap}")
        self.gap = gap

    @staticmethod
    def with_gap(gap: Duration) -> EventTimeSessionWindows:
        return EventTimeSessionWindows(to_millis(gap, "session gap"))

    def assign(self, timestamp: int) -> list[TimeWindow]:
        return [TimeWindow(timestamp, timestamp + self.gap)]

    def bounds(self, timestamp: int) -> Sequence[tuple[int, int]]:
        return ((timestamp, timestamp + self.gap),)
