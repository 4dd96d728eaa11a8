"""Two streams into one function: ``a.connect(b).process(CoProcessFunction)``.

Snapshot/restore contract: as for :class:`~aiostream_ckpt.jobspec.functions.KeyedProcessFunction`,
everything to remember goes into keyed state (``key_by(key_a, key_b)`` first):
it is shared by both inputs for the same key, checkpointed, restored (also at
another parallelism, by key group), and timers fire after a restore. Records of
the two inputs interleave in arrival order; a barrier is aligned over both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from aiostream_ckpt.jobspec.functions import Collector, Context, OnTimerContext, RuntimeContext

IN1 = TypeVar("IN1")
IN2 = TypeVar("IN2")
OUT = TypeVar("OUT")


class CoProcessFunction(Generic[IN1, IN2, OUT]):
    """Per-record functions for two connected streams.

    >>> from aiostream_ckpt.api.environment import StreamEnvironment
    >>> class Tag(CoProcessFunction):
    ...     def process_element1(self, value, ctx, out):
    ...         out.collect(("a", value))
    ...     def process_element2(self, value, ctx, out):
    ...         out.collect(("b", value))
    >>> env = StreamEnvironment("doc")
    >>> a, b = env.from_collection([1, 2]), env.from_collection([3])
    >>> sorted(env.execute_and_collect(a.connect(b).process(Tag(), uid="tag")))
    [('a', 1), ('a', 2), ('b', 3)]
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Prepare the instance (get state) before its first record."""

    def process_element1(self, value: IN1, ctx: Context, out: Collector[OUT]) -> None:
        """Handle a record of the first stream."""
        raise TypeError(f"{type(self).__name__} must override process_element1")

    def process_element2(self, value: IN2, ctx: Context, out: Collector[OUT]) -> None:
        """Handle a record of the second stream."""
        raise TypeError(f"{type(self).__name__} must override process_element2")

    def close(self) -> None:
        """Release resources when the instance stops (also on failure)."""


class KeyedCoProcessFunction(CoProcessFunction[IN1, IN2, OUT]):
    """Both inputs keyed alike: shared keyed state per key, and timers (``ctx.timer_service()``)."""

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector[OUT]) -> None:
        """Handle a timer of ``ctx.current_key`` set for ``timestamp``."""


@dataclass(frozen=True)
class CoSpec:
    """What ``connect(...).process`` asked for; key selectors per input when keyed."""

    function: CoProcessFunction[Any, Any, Any]
    key_selectors: tuple[Callable[[Any], Any], Callable[[Any], Any]] | None = None
