"""``left.interval_join(right).between(lower, upper).process(fn)``: the fluent half.

What the join does and its snapshot/restore contract: :mod:`aiostream_ckpt.jobspec.interval_join`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from aiostream_ckpt.api.windowed_stream import inherited_timestamp_assigner
from aiostream_ckpt.errors import JobGraphError
from aiostream_ckpt.jobspec.functions import OutputTag
from aiostream_ckpt.jobspec.interval_join import IntervalJoinFunction, ProcessJoinFunction
from aiostream_ckpt.jobspec.watermarks import TimestampAssigner

if TYPE_CHECKING:
    from aiostream_ckpt.api.stream import KeyedStream, Stream

L = TypeVar("L")
R = TypeVar("R")
OUT = TypeVar("OUT")


def _millis(bound: int | timedelta, what: str) -> int:
    if isinstance(bound, timedelta):
        return int(bound / timedelta(milliseconds=1))
    if isinstance(bound, bool) or not isinstance(bound, int):
        raise JobGraphError(
            f"interval join: {what} bound is ms (int) or a timedelta, not {bound!r}"
        )
    return bound


class IntervalJoin(Generic[L, R]):
    """``left.interval_join(right)``: say ``between(lower, upper)`` next."""

    def __init__(self, left: KeyedStream[L, Any], right: KeyedStream[R, Any]) -> None:
        self._left = left
        self._right = right

    def between(self, lower: int | timedelta, upper: int | timedelta) -> IntervalJoined[L, R]:
        """Join ``r`` to ``l`` when ``l.ts + lower <= r.ts <= l.ts + upper`` (ms or timedelta)."""
        return IntervalJoined(
            self._left, self._right, _millis(lower, "lower"), _millis(upper, "upper")
        )


class IntervalJoined(Generic[L, R]):
    """An interval join with its bounds; options, then ``process(fn)``."""

    def __init__(
        self, left: KeyedStream[L, Any], right: KeyedStream[R, Any], lower: int, upper: int
    ) -> None:
        self._left = left
        self._right = right
        self._lower = lower
        self._upper = upper
        self._late: tuple[OutputTag[Any] | None, OutputTag[Any] | None] = (None, None)

    def lower_bound_exclusive(self) -> IntervalJoined[L, R]:
        self._lower += 1
        return self

    def upper_bound_exclusive(self) -> IntervalJoined[L, R]:
        self._upper -= 1
        return self

    def side_output_left_late_data(self, tag: OutputTag[L]) -> IntervalJoined[L, R]:
        """Send left records that arrive behind the watermark to ``tag``, not to nowhere."""
        self._late = (tag, self._late[1])
        return self

    def side_output_right_late_data(self, tag: OutputTag[R]) -> IntervalJoined[L, R]:
        """Send late right records to ``tag`` instead of dropping them."""
        self._late = (self._late[0], tag)
        return self

    def process(
        self,
        function: ProcessJoinFunction[L, R, OUT],
        *,
        name: str = "interval_join",
        uid: str | None = None,
        parallelism: int | None = None,
        timestamp_assigners: tuple[TimestampAssigner, TimestampAssigner] | None = None,
        left_type: Any = None,
        right_type: Any = None,
    ) -> Stream[OUT]:
        """Run ``function`` on every pair; timestamps from the sources' strategies unless given."""
        left, right = self._left, self._right
        if timestamp_assigners is None:
            timestamp_assigners = (
                inherited_timestamp_assigner(left.transformation),
                inherited_timestamp_assigner(right.transformation),
            )
        join = IntervalJoinFunction(
            function,
            self._lower,
            self._upper,
            timestamp_assigners,
            late=self._late,
            types=(left_type, right_type),
        )
        keys = (left.key_selector, right.key_selector)
        return (
            left.connect(right)
            .key_by(*keys, key_type=_join_key_type(left, right))
            .process(join, name=name, uid=uid, parallelism=parallelism)
        )


def _join_key_type(left: KeyedStream[Any, Any], right: KeyedStream[Any, Any]) -> Any:
    """Return the key type the inputs declared: records meet on equal keys, so one type."""
    declared = [t for t in (left.key_type, right.key_type) if t is not None]
    if len(declared) == 2 and declared[0] != declared[1]:
        raise JobGraphError(
            f"interval join: the inputs declare different key types ({declared[0]!r}, "
            f"{declared[1]!r}); records meet on equal keys, so declare one type"
        )
    return declared[0] if declared else None
