"""The per-split watermarks of a source instance.

A source instance keeps one watermark per split (file, partition) and emits
the minimum over its active splits, so a fast partition cannot push event
time past a slow one. With :meth:`WatermarkStrategy.with_idleness`, a split
that produced nothing for that long (processing time, the injected clock) is
left out; when all are, the instance tells its consumers it is idle. The
strategy itself is part of the job description (:mod:`aiostream_ckpt.jobspec.watermarks`).

**Where in a split the watermark moves is a function of the split's records,
not of how they were fetched.** Which records are late, and which window a
session record lands in, depend on the watermark current when each record
arrives. Had it moved after every read (as before), a Kafka partition read in
fetches of timing-dependent size would decide lateness differently on a loaded
machine than in the failure-free reference run, and a proof would see records
"lost" that were only judged late. So each split is cut into chunks of
``chunk_records`` records, counted from the split's start (the count is in the
checkpoint); the watermark moves at the end of each chunk, and the batch read is
cut there too (:meth:`SourceWatermarks.read_segments`). A chunk left partial by
a read moves the watermark only when the reader says no more of the split is
available now (:class:`~aiostream_ckpt.connectors.base.BacklogAwareReader`: a
live tail, where waiting would only add latency) or when the split ends; a
bounded input or a backlog never does, so its event time replays the same way
whatever the fetch sizes. Across several splits of one instance, or several
source instances, how records interleave still depends on timing, as in Flink:
event-time results are reproducible for a pipeline fed by one split per
window operator input, or by in-order data.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from aiostream_ckpt.connectors.base import (
    BacklogAwareReader,
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
    __slots__ = ("filled", "last_active", "max_ts", "pending")

    def __init__(self, now: float) -> None:
        #: the newest timestamp the watermark may use: of chunks that ended (or were released)
        self.max_ts = MIN_WATERMARK
        #: records of the current chunk so far, and their newest timestamp
        self.filled = 0
        self.pending = MIN_WATERMARK
        self.last_active = now

    def release(self) -> bool:
        """Let the watermark use the current chunk's records; True when that moved ``max_ts``."""
        if self.pending > self.max_ts:
            self.max_ts = self.pending
            return True
        return False

    def release_all(self) -> int:
        """Release the chunk (the split ended); return the newest timestamp it reached."""
        self.release()
        return self.max_ts


#: records a split's chunk holds when the source does not say (``job.batch_size``'s default)
DEFAULT_CHUNK_RECORDS = 2048

#: a batch cut where the watermark moves: its records, then what to send after them
Segment = tuple[list[Any], "WatermarkUpdate | None"]


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
        chunk_records: int = DEFAULT_CHUNK_RECORDS,
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
        self._backlog = reader if isinstance(reader, BacklogAwareReader) else None
        if chunk_records < 1:
            raise ValueError(f"chunk_records must be >= 1, not {chunk_records}")
        self._chunk = chunk_records
        self._monotonic = monotonic
        self._splits: dict[str, _Split] = {}
        self._ended = False
        self._had_splits = False
        #: Last watermark sent; never goes backwards.
        super().__init__()

    async def read_segments(self, max_records: int) -> list[Segment] | None:
        """Read up to ``max_records``, cut where the watermark moves; ``None`` at end of input.

        Each segment's records go downstream before its update (a status change
        and/or a new watermark), so every record meets the watermark a fetch of
        any other size would have given it (see the module docstring). The
        segments of one read go out together: no barrier falls between them,
        so the reader's position covers them all.
        """
        split_reader = self._split_reader
        if split_reader is None:
            batch = await self._reader.read_batch(max_records)
            if batch is None:
                self._ended = True
                return None
            groups = [(WHOLE_READER, batch)] if batch else []
        else:
            found = await split_reader.read_split_batches(max_records)
            if found is None:
                self._ended = True
                return None
            groups = found
        segments: list[Segment] = []
        records: list[Any] = []
        # A chunk's end inside the read sees the splits as they were at that record: one
        # the read finished still holds the minimum there (poll() lets it go after).
        reading = set(self._splits) | set(self._active())
        for split, batch in groups:
            for part, ends_chunk in self._observe(split, batch):
                records = records + part if records else part
                if ends_chunk:
                    segments.append((records, self._step(reading | {split})))
                    records = []
        await self._release_caught_up()  # what the task's poll() after the read then sends
        segments.append((records, None))
        return segments

    async def read_batch(self, max_records: int) -> list[Any] | None:
        """Read as :meth:`read_segments` with the segments joined (watermarks: :meth:`poll`).

        For callers that do not send watermarks between records (tests, tools);
        the source task uses :meth:`read_segments`.
        """
        segments = await self.read_segments(max_records)
        if segments is None:
            return None
        return [r for records, _ in segments for r in records]

    def _observe(self, split: str, records: list[Any]) -> list[tuple[list[Any], bool]]:
        """Cut ``records`` at the split's chunk ends: each part, and whether it ends a chunk.

        Records without a timestamp are left out (``record_failed``).
        """
        if not records:
            return []
        assign = self._assign
        try:
            stamps = list(map(assign, records))
            if stamps and not isinstance(max(stamps), int | float):
                raise TypeError
        except Exception:
            records, stamps = self._assign_each(records)
            if not records:
                return []
        now = self._monotonic()
        state = self._splits.get(split)
        if state is None:
            state = self._splits[split] = _Split(now)
        state.last_active = now
        self._had_splits = True
        chunk = self._chunk
        parts: list[tuple[list[Any], bool]] = []
        i, n = 0, len(records)
        while i < n:
            j = min(n, i + chunk - state.filled)
            newest = max(stamps[i:j]) if j - i > 1 else stamps[i]
            if newest > state.pending:
                state.pending = newest
            state.filled += j - i
            ends = state.filled >= chunk
            if ends:
                state.release()
                state.filled = 0
                state.pending = MIN_WATERMARK
            parts.append((records if (i, j) == (0, n) else records[i:j], ends))
            i = j
        return parts

    async def _release_caught_up(self) -> None:
        """Release partial chunks of splits the reader has read all of for now (a live tail).

        Never on a bounded input or a backlog: there the chunk completes, or the
        split ends (:meth:`current` releases it then), at the same record
        whatever the fetch sizes. A reader that cannot tell counts as caught up
        (every read moves the watermark, as readers without splits always did).
        """
        backlog = self._backlog
        for split, state in self._splits.items():
            if state.filled and state.pending > state.max_ts:
                if backlog is not None and await backlog.has_backlog(split):
                    continue
                state.release()

    def _step(self, active: Collection[str] | None = None) -> WatermarkUpdate | None:
        """Return what a chunk end sends: the new minimum over the splits, if it moved."""
        low = self.current(active)
        if self._declared is not None:
            declared = self._declared.emitted_watermark()
            if declared is not None and (low is None or declared > low):
                low = declared
        return self.advance(low)

    def _assign_each(self, records: list[Any]) -> tuple[list[Any], list[Any]]:
        """Time a batch the assigner failed on, record by record: the timed records, their times."""
        kept: list[Any] = []
        stamps: list[Any] = []
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
            stamps.append(ts)
        return kept, stamps

    def _active(self) -> Collection[str]:
        if self._split_reader is not None:
            return self._split_reader.active_splits()
        return () if self._ended else (WHOLE_READER,)

    def current(self, active: Collection[str] | None = None) -> int | None:
        """Min watermark over active, non-idle splits; ``None`` when there is none.

        ``active``: the splits to count (default: the reader's active ones now).
        """
        now = self._monotonic()
        idle_after = self._idle_after
        if active is None:
            active = self._active()
        splits = self._splits
        ended = MIN_WATERMARK
        if len(splits) > len(active):
            gone = [s for s in splits if s not in active]
            # a finished split's last chunk counts before it lets go: where it ends is
            # the same record however the split was fetched
            ended = min(splits.pop(s).release_all() for s in gone)
        if not active and self._had_splits:
            # Its splits are done and end of input is next. Going idle now would let
            # consumers run ahead while tasks between still hold timers for its records.
            return max(self.watermark, self._lag(ended))
        self._had_splits = self._had_splits or bool(active)
        low: int | None = None
        for split in active:
            state = splits.get(split)
            if state is None:
                state = splits[split] = _Split(now)  # idle timer starts now
            if idle_after is not None and now - state.last_active >= idle_after:
                continue
            wm = self._lag(state.max_ts)
            if low is None or wm < low:
                low = wm
        return low

    def _lag(self, max_ts: int) -> int:
        """Return the watermark a split whose newest timestamp is ``max_ts`` allows."""
        return MIN_WATERMARK if max_ts == MIN_WATERMARK else max_ts - self._delay - 1

    def poll(self) -> WatermarkUpdate | None:
        """After a read: the status change and/or watermark advance to send, if any."""
        return self._step()

    def snapshot(self) -> dict[str, Any]:
        """Watermark, idleness, per split ``[max timestamp, idle, chunk records, chunk max]``."""
        now = self._monotonic()
        idle_after = self._idle_after
        return {
            "watermark": self.watermark,
            "idle": self.idle,
            "splits": {
                split: [
                    state.max_ts,
                    idle_after is not None and now - state.last_active >= idle_after,
                    state.filled,
                    state.pending,
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
        for split, saved in (time.get("splits") or {}).items():
            max_ts, idle = saved[0], saved[1]
            state = self._splits[split] = _Split(now)
            state.max_ts = int(max_ts)
            if len(saved) >= 4:  # the chunk in progress (checkpoints before chunks had none)
                state.filled, state.pending = int(saved[2]), int(saved[3])
            if idle and idle_after is not None:
                state.last_active = now - idle_after
        self._had_splits = self._had_splits or bool(self._splits)
        self.watermark = int(time["watermark"])
        self.idle = bool(time.get("idle"))
