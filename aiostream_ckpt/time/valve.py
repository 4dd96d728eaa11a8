"""A task's watermark from its input channels (Flink's StatusWatermarkValve).

The task's event time is the minimum of its channels' watermarks: a record
from any channel may still be that old. Channels that ended or declared
themselves idle are left out; when every live channel is idle, the task is
idle too and says so downstream. The output never goes backwards: a channel
that comes back from idleness behind the others holds event time where it is
until it catches up.
"""

from __future__ import annotations

from typing import Any

from aiostream_ckpt.jobspec.watermarks import MIN_WATERMARK
from aiostream_ckpt.time.watermarks import WatermarkStatusTracker, WatermarkUpdate


class WatermarkValve(WatermarkStatusTracker):
    """Per-channel watermarks and status of one task's input gate.

    >>> v = WatermarkValve(2)
    >>> v.on_watermark(0, 10) is None  # channel 1 still at the minimum
    True
    >>> v.on_watermark(1, 7)
    WatermarkUpdate(idle=None, watermark=7)
    >>> v.on_status(1, idle=True)  # channel 0 alone now
    WatermarkUpdate(idle=None, watermark=10)
    """

    __slots__ = ("_ended", "_idle", "_marks", "idle", "watermark")

    def __init__(self, num_channels: int) -> None:
        self._marks = [MIN_WATERMARK] * num_channels
        self._idle = [False] * num_channels
        self._ended = [False] * num_channels
        super().__init__()

    def snapshot(self) -> dict[str, Any]:
        """Watermark, idleness and per-channel ``[watermark, idle]``, for the checkpoint."""
        return {
            "watermark": self.watermark,
            "idle": self.idle,
            "channels": [[m, i] for m, i in zip(self._marks, self._idle, strict=True)],
        }

    def restore(self, time: dict[str, Any], *, channels: bool) -> None:
        """Resume from :meth:`snapshot`'s state; the channels' only when ``channels`` is true.

        The caller passes ``channels=False`` when the input layout changed: then
        a channel index may name another upstream instance, and the channels
        start at the minimum, filled by the upstream tasks' announcements.
        """
        self.watermark = int(time["watermark"])
        self.idle = bool(time.get("idle"))
        restored = time.get("channels")
        if channels and restored is not None and len(restored) == len(self._marks):
            self._marks = [int(m) for m, _ in restored]
            self._idle = [bool(i) for _, i in restored]

    def on_watermark(self, channel: int, timestamp: int) -> WatermarkUpdate | None:
        if timestamp <= self._marks[channel]:
            return None
        self._marks[channel] = timestamp
        if self._idle[channel]:
            # A watermark means the sender is active again, status or not.
            self._idle[channel] = False
        return self._recompute()

    def on_status(self, channel: int, *, idle: bool) -> WatermarkUpdate | None:
        if self._idle[channel] is idle:
            return None
        self._idle[channel] = idle
        return self._recompute()

    def on_end(self, channel: int) -> WatermarkUpdate | None:
        self._ended[channel] = True
        return self._recompute()

    def _recompute(self) -> WatermarkUpdate | None:
        low: int | None = None
        for mark, idle, ended in zip(self._marks, self._idle, self._ended, strict=True):
            if not (idle or ended) and (low is None or mark < low):
                low = mark
        return self.advance(low, silent=all(self._ended))
