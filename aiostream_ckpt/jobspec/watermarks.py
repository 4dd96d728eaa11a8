"""Event time as a job declares it: watermark strategies, timestamps, durations.

Records carry no timestamp field through the runtime (that would cost every
operator on the hot path): a :class:`WatermarkStrategy`'s timestamp assigner
reads it from the event, at the source for watermarks and again in event-time
operators (windows) that need a record's time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from aiostream_ckpt.durations import duration_millis
from aiostream_ckpt.errors import ConfigError

#: Watermark bounds (milliseconds), as Flink's ``Long.MIN_VALUE`` / ``Long.MAX_VALUE``.
MIN_WATERMARK = -(2**63)
MAX_WATERMARK = 2**63 - 1
TimestampAssigner = Callable[[Any], int]
#: milliseconds (int), a ``timedelta``, or a string with a unit (``"1m"``, as in the config)
Duration = int | timedelta | str


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
