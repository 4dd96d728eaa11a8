"""``key_by(...).window(assigner)``: the fluent half of windows.

A window needs each record's event time. Records carry none through the
runtime, so the window reads it with the timestamp assigner of the watermark
strategy of the source(s) upstream, unless ``window(..., timestamp_assigner=)``
says otherwise (needed when a map in between changed the records' shape).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from aiostream_ckpt.errors import JobGraphError
from aiostream_ckpt.jobspec.functions import OutputTag
from aiostream_ckpt.jobspec.graph import Transformation, TransformKind, WindowKind, WindowSpec
from aiostream_ckpt.jobspec.watermarks import Duration, TimestampAssigner, to_millis
from aiostream_ckpt.jobspec.window_functions import AggregateFunction, ProcessWindowFunction
from aiostream_ckpt.jobspec.windows import WindowAssigner
from aiostream_ckpt.state.descriptors import Serializer

if TYPE_CHECKING:
    from aiostream_ckpt.api.stream import KeyedStream, Stream

T = TypeVar("T")
K = TypeVar("K")
R = TypeVar("R")


def inherited_timestamp_assigner(node: Transformation) -> TimestampAssigner:
    """Find the one timestamp assigner of the sources upstream of ``node``."""
    found: list[TimestampAssigner] = []
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n.id in seen:
            continue
        seen.add(n.id)
        if n.kind is TransformKind.SOURCE:
            strategy = n.watermark_strategy
            if strategy is None or strategy.timestamp_assigner is None:
                raise JobGraphError(
                    f"event-time operator after source {n.uid!r}, which has no watermark "
                    "strategy with a timestamp assigner: pass watermark_strategy= to "
                    "from_source, or timestamp_assigner= to window()"
                )
            if strategy.timestamp_assigner not in found:
                found.append(strategy.timestamp_assigner)
        stack.extend(n.inputs)
    if len(found) != 1:
        raise JobGraphError(
            "the sources upstream use different timestamp assigners: "
            "pass timestamp_assigner= to window()"
        )
    return found[0]


class WindowedStream(Generic[T, K]):
    """A keyed stream cut into event-time windows; a window function ends it.

    >>> from aiostream_ckpt.api import StreamEnvironment
    >>> from aiostream_ckpt.connectors.collection import CollectionSource
    >>> from aiostream_ckpt.time import TumblingEventTimeWindows, WatermarkStrategy
    >>> env = StreamEnvironment("doc")
    >>> wms = WatermarkStrategy.for_bounded_out_of_orderness(10).with_timestamp_assigner(
    ...     lambda e: e[1])
    >>> events = env.from_source(
    ...     CollectionSource([("a", 1), ("b", 3), ("a", 12), ("a", 5)]), watermark_strategy=wms)
    >>> sums = (events.key_by(lambda e: e[0])
    ...     .window(TumblingEventTimeWindows.of(10))
    ...     .reduce(lambda x, y: (x[0], x[1] + y[1]), uid="sums", value_type=tuple[str, int]))
    >>> sorted(env.execute_and_collect(sums))
    [('a', 6), ('a', 12), ('b', 3)]

    The window's contents live in keyed state: declare their type
    (``accumulator_type``, ``value_type``, ``element_type``) when they are not
    plain JSON, so they read back as such after a restore (``value_type`` above:
    tuples; see :mod:`~aiostream_ckpt.state.codecs`).
    """

    def __init__(
        self,
        keyed: KeyedStream[T, K],
        assigner: WindowAssigner,
        timestamp_assigner: TimestampAssigner | None,
    ) -> None:
        self._keyed = keyed
        self._assigner = assigner
        self._timestamps = timestamp_assigner
        self._lateness = 0
        self._late_tag: OutputTag[Any] | None = None

    def allowed_lateness(self, lateness: Duration) -> WindowedStream[T, K]:
        """Keep windows ``lateness`` ms past their end; late records re-fire them."""
        self._lateness = to_millis(lateness, "allowed lateness")
        return self

    def side_output_late_data(self, tag: OutputTag[T]) -> WindowedStream[T, K]:
        """Send records too late for any window to side output ``tag``."""
        self._late_tag = tag
        return self

    def aggregate(
        self,
        function: AggregateFunction[T, Any, R],
        window_function: ProcessWindowFunction[R, Any, K] | None = None,
        *,
        name: str = "window-aggregate",
        uid: str | None = None,
        parallelism: int | None = None,
        serializer: Serializer = "json",
        accumulator_type: Any = None,
    ) -> Stream[Any]:
        """Aggregate incrementally; emit ``get_result`` (or ``window_function``'s output)."""
        return self._build(
            WindowKind.AGGREGATE, function, window_function, name, uid, parallelism, serializer,
            accumulator_type,
        )  # fmt: skip

    def reduce(
        self,
        function: Callable[[T, T], T],
        window_function: ProcessWindowFunction[T, Any, K] | None = None,
        *,
        name: str = "window-reduce",
        uid: str | None = None,
        parallelism: int | None = None,
        serializer: Serializer = "json",
        value_type: Any = None,
    ) -> Stream[Any]:
        """Fold the window's records with ``function`` as they arrive."""
        return self._build(
            WindowKind.REDUCE, function, window_function, name, uid, parallelism, serializer,
            value_type,
        )  # fmt: skip

    def process(
        self,
        function: ProcessWindowFunction[T, R, K],
        *,
        name: str = "window-process",
        uid: str | None = None,
        parallelism: int | None = None,
        serializer: Serializer = "json",
        element_type: Any = None,
    ) -> Stream[R]:
        """Keep every record of the window; hand them all to ``function`` when it fires."""
        contents = None if element_type is None else list[element_type]
        return self._build(
            WindowKind.PROCESS, function, None, name, uid, parallelism, serializer, contents
        )

    def _build(
        self,
        kind: WindowKind,
        function: Any,
        window_function: ProcessWindowFunction[Any, Any, Any] | None,
        name: str,
        uid: str | None,
        parallelism: int | None,
        serializer: Serializer,
        state_type: Any,
    ) -> Stream[Any]:
        keyed = self._keyed
        spec = WindowSpec(
            assigner=self._assigner,
            kind=kind,
            timestamp_assigner=self._timestamps
            or inherited_timestamp_assigner(keyed.transformation),
            function=function,
            window_function=window_function,
            allowed_lateness=self._lateness,
            late_tag=self._late_tag,
            serializer=serializer,
            state_type=state_type,
        )
        node = keyed._add(TransformKind.WINDOW, name, fn=spec, uid=uid, parallelism=parallelism)
        return keyed._stream(node)
