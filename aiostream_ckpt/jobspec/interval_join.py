"""Interval join (Flink's ``KeyedStream.intervalJoin``): pairs of records close in event time.

The fluent half (``interval_join(...).between(...)``) is :mod:`aiostream_ckpt.api.interval_join`.

``left.interval_join(right).between(lower, upper).process(fn)`` calls
``fn.process_element(l, r, ctx, out)`` for every pair of records with equal
keys whose times satisfy ``l.ts + lower <= r.ts <= l.ts + upper`` (bounds in
ms, inclusive unless made exclusive).

How (Flink's ``IntervalJoinOperator``): both inputs are keyed alike and meet
in one keyed two-input operator. Each record is kept in keyed map state
(``time -> records``) of its side and joined at once with the other side's
kept records in range, so each pair is emitted once, when its second record
arrives. State is bounded by the watermark: a left record at ``a`` can meet no
on-time right record once the watermark reaches ``a + upper`` (a right record
at or before the watermark is late), a right record at ``b`` none once it
reaches ``b - lower``; an event-time timer at that time drops it. A record at
or before the watermark when it arrives is late: it joins nothing and goes to
the side output given for its side, if any (else it is dropped, as in Flink).

Snapshot/restore contract: the kept records and their cleanup timers are keyed
state, in every checkpoint, restored by key group at any parallelism; kept
records must be JSON-able unless ``left_type``/``right_type`` declare them.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from aiostream_ckpt.errors import JobGraphError
from aiostream_ckpt.jobspec.co_functions import KeyedCoProcessFunction
from aiostream_ckpt.jobspec.functions import (
    Collector,
    Context,
    OnTimerContext,
    OutputTag,
    RuntimeContext,
)
from aiostream_ckpt.jobspec.watermarks import TimestampAssigner
from aiostream_ckpt.state.descriptors import MapStateDescriptor

L = TypeVar("L")
R = TypeVar("R")
OUT = TypeVar("OUT")


class JoinContext:
    """The pair's times (``left_timestamp``, ``right_timestamp``), its key and side outputs."""

    __slots__ = ("_ctx", "current_key", "left_timestamp", "right_timestamp")

    def __init__(self) -> None:
        self._ctx: Context | None = None
        self.current_key: Any = None
        self.left_timestamp = 0
        self.right_timestamp = 0

    @property
    def timestamp(self) -> int:
        """The later of the two times (Flink's result timestamp)."""
        return max(self.left_timestamp, self.right_timestamp)

    def output(self, tag: OutputTag[Any], value: Any) -> None:
        """Emit ``value`` to side output ``tag``."""
        assert self._ctx is not None
        self._ctx.output(tag, value)


class ProcessJoinFunction(Generic[L, R, OUT]):
    """Handles each joined pair.

    >>> from aiostream_ckpt.api.environment import StreamEnvironment
    >>> from aiostream_ckpt.connectors.collection import CollectionSource
    >>> from aiostream_ckpt.time import WatermarkStrategy
    >>> wms = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(
    ...     lambda e: e["ts"])
    >>> env = StreamEnvironment("doc")
    >>> views = env.from_source(CollectionSource(
    ...     [{"user": "u", "ts": 10}, {"user": "u", "ts": 50}]), watermark_strategy=wms, uid="v")
    >>> buys = env.from_source(CollectionSource(
    ...     [{"user": "u", "ts": 12}, {"user": "u", "ts": 90}]), watermark_strategy=wms, uid="b")
    >>> class Pair(ProcessJoinFunction):
    ...     def process_element(self, left, right, ctx, out):
    ...         out.collect((left["ts"], right["ts"]))
    >>> joined = (views.key_by(lambda e: e["user"]).interval_join(buys.key_by(lambda e: e["user"]))
    ...     .between(0, 5).process(Pair(), uid="view-buy"))
    >>> env.execute_and_collect(joined)
    [(10, 12)]
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Prepare the instance before its first pair."""

    def process_element(self, left: L, right: R, ctx: JoinContext, out: Collector[OUT]) -> None:
        """Handle one pair; emit any number of records with ``out.collect``."""
        raise TypeError(f"{type(self).__name__} must override process_element")

    def close(self) -> None:
        """Release resources when the instance stops (also on failure)."""


class IntervalJoinFunction(KeyedCoProcessFunction[Any, Any, Any]):
    """The join as a keyed two-input function: kept records, joins, cleanup timers.

    ``lower``/``upper`` are inclusive bounds in ms (``between`` turns exclusive
    ones into these). Public so that a test harness can drive it record by record.
    """

    def __init__(
        self,
        function: ProcessJoinFunction[Any, Any, Any],
        lower: int,
        upper: int,
        timestamps: tuple[TimestampAssigner, TimestampAssigner],
        *,
        late: tuple[OutputTag[Any] | None, OutputTag[Any] | None] = (None, None),
        types: tuple[Any, Any] = (None, None),
    ) -> None:
        if lower > upper:
            raise JobGraphError(f"interval join: lower bound {lower} > upper bound {upper}")
        self.function = function
        self.lower = lower
        self.upper = upper
        self.timestamps = timestamps
        self.late = late
        self.types = types

    def open(self, ctx: RuntimeContext) -> None:
        left_t, right_t = (None if t is None else list[t] for t in self.types)  # type: ignore[valid-type]
        self._left = ctx.get_map_state(MapStateDescriptor("interval-join-left", int, left_t))
        self._right = ctx.get_map_state(MapStateDescriptor("interval-join-right", int, right_t))
        self._join_ctx = JoinContext()
        self.function.open(ctx)

    def close(self) -> None:
        self.function.close()

    def process_element1(self, value: Any, ctx: Context, out: Collector[Any]) -> None:
        ts = self.timestamps[0](value)
        if self._keep(value, ts, self._left, self.late[0], ctx):
            # right records at [ts + lower, ts + upper]; none of them on time after ts + upper
            self._join(value, ts, self._right, ts + self.lower, ts + self.upper, True, ctx, out)
            ctx.timer_service().register_event_time_timer(ts + self.upper)

    def process_element2(self, value: Any, ctx: Context, out: Collector[Any]) -> None:
        ts = self.timestamps[1](value)
        if self._keep(value, ts, self._right, self.late[1], ctx):
            self._join(value, ts, self._left, ts - self.upper, ts - self.lower, False, ctx, out)
            ctx.timer_service().register_event_time_timer(ts - self.lower)

    def _keep(
        self, value: Any, ts: int, ours: Any, late: OutputTag[Any] | None, ctx: Context
    ) -> bool:
        if ts <= ctx.timer_service().current_watermark():
            if late is not None:
                ctx.output(late, value)
            return False
        bucket = ours.get(ts)
        ours.put(ts, [value] if bucket is None else [*bucket, value])
        return True

    def _join(
        self,
        value: Any,
        ts: int,
        theirs: Any,
        lo: int,
        hi: int,
        is_left: bool,
        ctx: Context,
        out: Collector[Any],
    ) -> None:
        jc = self._join_ctx
        jc._ctx = ctx
        jc.current_key = ctx.current_key
        pe = self.function.process_element
        for other_ts, others in theirs.items():
            if lo <= other_ts <= hi:
                if is_left:
                    jc.left_timestamp, jc.right_timestamp = ts, other_ts
                    for other in others:
                        pe(value, other, jc, out)
                else:
                    jc.left_timestamp, jc.right_timestamp = other_ts, ts
                    for other in others:
                        pe(other, value, jc, out)

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector[Any]) -> None:
        # the timer of a left record at a fires at a + upper, of a right one at b - lower
        self._left.remove(timestamp - self.upper)
        self._right.remove(timestamp + self.lower)
