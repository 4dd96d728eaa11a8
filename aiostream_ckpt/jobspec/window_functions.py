"""Window functions: what a window computes when it fires.

State contract: a window's contents (accumulator, reduced value or elements)
are keyed state of the window operator, in every checkpoint; the functions
themselves keep nothing between calls. Treat accumulators as values: return
a new one from ``add``/``merge`` rather than relying on in-place changes
being seen by a snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from aiostream_ckpt.jobspec.functions import Collector, RuntimeContext
from aiostream_ckpt.jobspec.windows import TimeWindow

IN = TypeVar("IN")
ACC = TypeVar("ACC")
OUT = TypeVar("OUT")
KEY = TypeVar("KEY")


class AggregateFunction(Generic[IN, ACC, OUT]):
    """Incremental aggregation: one accumulator per window, updated per record.

    ``merge`` is needed for session windows, whose windows merge.

    >>> class Count(AggregateFunction):
    ...     def create_accumulator(self):
    ...         return 0
    ...     def add(self, value, accumulator):
    ...         return accumulator + 1
    ...     def get_result(self, accumulator):
    ...         return accumulator
    ...     def merge(self, a, b):
    ...         return a + b
    >>> Count().add("x", Count().create_accumulator())
    1
    """

    def create_accumulator(self) -> ACC:
        raise TypeError(f"{type(self).__name__} must override create_accumulator")

    def add(self, value: IN, accumulator: ACC) -> ACC:
        raise TypeError(f"{type(self).__name__} must override add")

    def get_result(self, accumulator: ACC) -> OUT:
        raise TypeError(f"{type(self).__name__} must override get_result")

    def merge(self, a: ACC, b: ACC) -> ACC:
        raise TypeError(f"{type(self).__name__} must override merge (session windows merge)")


class CountAggregate(AggregateFunction[IN, int, int]):
    """Counts the records of a window, whatever they are; merges by adding.

    >>> c = CountAggregate()
    >>> c.get_result(c.merge(c.add("x", c.create_accumulator()), 2))
    3
    """

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: IN, accumulator: int) -> int:
        return accumulator + 1

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, a: int, b: int) -> int:
        return a + b


class WindowContext:
    """What a window function knows when its window fires."""

    __slots__ = ("current_watermark", "window")

    def __init__(self, window: TimeWindow, current_watermark: int) -> None:
        self.window = window
        self.current_watermark = current_watermark


class ProcessWindowFunction(Generic[IN, OUT, KEY]):
    """Sees the key, the window and all its elements (or the one pre-aggregated result).

    >>> class Describe(ProcessWindowFunction):
    ...     def process(self, key, context, elements, out):
    ...         out.collect((key, context.window.start, len(list(elements))))
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Prepare before the first window fires."""

    def process(
        self, key: KEY, context: WindowContext, elements: Iterable[IN], out: Collector[OUT]
    ) -> None:
        raise TypeError(f"{type(self).__name__} must override process")

    def close(self) -> None:
        """Release resources when the instance stops."""


#: What a window runs per record, by ``WindowSpec.kind``: an aggregate, a
#: reduce callable, or a process function that gets every element at the end.
WindowFunction = (
    AggregateFunction[Any, Any, Any]
    | Callable[[Any, Any], Any]
    | ProcessWindowFunction[Any, Any, Any]
)
