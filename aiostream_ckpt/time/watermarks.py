"""The per-split watermarks of a source instance.

A source instance keeps one watermark per split (file, partition) and emits
the minimum over its active splits, so a fast partition cannot push event
time past a slow one. With :meth:`WatermarkStrategy.with_idleness`, a split
that produced nothing for that long (processing time, the injected clock) is
left out; when all are, the instance tells its consumers it is idle. The
strategy itself is part of the job description (:mod:`aiostream_ckpt.jobspec.watermarks`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from aiostream_ckpt.connectors.base import (
    RecordErrorFn,
    SourceReader,
    SplitAwareReader,
    WatermarkEmittingReader,
    raise_record_error,
)
from aiostream_ckpt.jobspec.watermarks import MIN_WATERMARK, WatermarkStrategy
from aiostream_ckpt.user_errors import function_name

#: The split id of a reader that cannot tell its splits apart.
WHOLE_READER = "*"


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
    :meth:`poll` after each read says what to send downstream. A record the
    timestamp assigner fails on (or gives no number for) goes to
    ``record_failed`` (the task's ``errors.on_process_error``) and, when that
    returns, is left out of the batch.
    """

    def __init__(
        self,
        strategy: WatermarkStrategy,
        reader: SourceReader,
        monotonic: Callable[[], float],
    ) -> None:
        self._assign = strategy.assigner()
        self.record_failed: RecordErrorFn = raise_record_error
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
                batch = self._observe(WHOLE_READER, batch)
            return batch
        groups = await split_reader.read_split_batches(max_records)
        if groups is None:
            self._ended = True
            return None
        if len(groups) == 1:
            split, records = groups[0]
            return self._observe(split, records)
        out: list[Any] = []
        for split, records in groups:
            out.extend(self._observe(split, records))
        return out

    def _observe(self, split: str, records: list[Any]) -> list[Any]:
        """Note the split's newest timestamp; return ``records``, those without one left out."""
        if not records:
            return records
        try:
            ts = max(map(self._assign, records))
        except Exception:
            records, ts = self._assign_each(records)
            if not records:
                return records
        now = self._monotonic()
        state = self._splits.get(split)
        if state is None:
            state = self._splits[split] = _Split(now)
        if ts > state.max_ts:
            state.max_ts = ts
        state.last_active = now
        return records

    def _assign_each(self, records: list[Any]) -> tuple[list[Any], Any]:
        """Time a batch the assigner failed on, record by record: the timed records, their max."""
        kept: list[Any] = []
        newest: Any = MIN_WATERMARK
        function = f"timestamp assigner {function_name(self._assign)}"
        for rec in records:
            try:
                ts = self._assign(rec)
                if not isinstance(ts, int | float) or isinstance(ts, bool):
                    raise TypeError(f"the timestamp is {ts!r}, not milliseconds (an int)")
            except Exception as exc:
                self.record_failed(function, rec, exc)  # raises unless dead-lettered
                continue
            kept.append(rec)
            newest = max(newest, ts)
        return kept, newest

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
