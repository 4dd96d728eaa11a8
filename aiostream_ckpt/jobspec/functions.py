"""Process functions: the user code that runs inside operators.

Snapshot/restore contract: a keyed process function keeps everything it must
remember in keyed state obtained from :meth:`RuntimeContext.get_state` in
:meth:`KeyedProcessFunction.open`. That state is part of every checkpoint and
is restored before ``open`` returns after a failure, matched by the operator's
uid. Plain attributes of the function object are *not* checkpointed: after a
restart the function is built afresh.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, Protocol, TypeVar, overload

from aiostream_ckpt.errors import JobGraphError
from aiostream_ckpt.jobspec.state import ListState, MapState, ReducingState, ValueState
from aiostream_ckpt.state.backend import KeyedStateBackend
from aiostream_ckpt.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)


class BroadcastStates(Protocol):
    """The broadcast states an operator instance hands its function (``runtime.two_input``)."""

    def get(self, descriptor: MapStateDescriptor[Any, Any]) -> MapState[Any, Any]: ...


IN = TypeVar("IN")
OUT = TypeVar("OUT")
T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")
_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")


@dataclass(frozen=True)
class OutputTag(Generic[T]):
    """Names a side output; equal ids are the same side output.

    >>> OutputTag("late-events")
    OutputTag(id='late-events')
    """

    id: str

    def __post_init__(self) -> None:
        if not _TAG_RE.match(self.id):
            raise ValueError(f"invalid output tag {self.id!r}: letters, digits, '_', '.', '-'")


class Collector(Generic[OUT]):
    """Where a function emits records: ``out.collect(record)``.

    ``collect`` is rebound to the output batch's ``append`` for every batch, so
    emitting costs one list append.
    """

    __slots__ = ("collect",)

    def __init__(self) -> None:
        self.collect: Callable[[OUT], None] = _no_output

    def detach(self) -> None:
        """Stop emitting into the last batch (``collect`` raises until the next one)."""
        self.collect = _no_output


def _no_output(record: Any) -> None:
    raise RuntimeError("collect() called outside of record processing")


class RuntimeContext:
    """What an operator instance knows about itself; hands out keyed state."""

    def __init__(
        self,
        *,
        operator_uid: str,
        subtask_index: int,
        parallelism: int,
        params: dict[str, Any],
        backend: KeyedStateBackend | None,
    ) -> None:
        self.operator_uid = operator_uid
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.params = params
        self._backend = backend

    @overload
    def get_state(self, descriptor: ValueStateDescriptor[T]) -> ValueState[T]: ...
    @overload
    def get_state(self, descriptor: ListStateDescriptor[T]) -> ListState[T]: ...
    @overload
    def get_state(self, descriptor: MapStateDescriptor[K, V]) -> MapState[K, V]: ...
    @overload
    def get_state(self, descriptor: ReducingStateDescriptor[T]) -> ReducingState[T]: ...
    def get_state(self, descriptor: StateDescriptor) -> Any:
        """Keyed state for ``descriptor``, scoped to the current key.

        Typed by the descriptor: ``ValueStateDescriptor("n", int, default=0)``
        gives a ``ValueState[int]`` (:mod:`~aiostream_ckpt.jobspec.state`).
        """
        if self._backend is None:
            # not restartable: every attempt would open the same way
            raise JobGraphError(
                f"operator {self.operator_uid!r} asks for keyed state {descriptor.name!r} in "
                "open() but is not keyed: keyed state needs key_by(...).process(...) with a "
                "KeyedProcessFunction"
            )
        return self._backend.create_state(descriptor)

    def get_value_state(self, descriptor: ValueStateDescriptor[T]) -> ValueState[T]:
        return self.get_state(descriptor)

    def get_list_state(self, descriptor: ListStateDescriptor[T]) -> ListState[T]:
        return self.get_state(descriptor)

    def get_map_state(self, descriptor: MapStateDescriptor[K, V]) -> MapState[K, V]:
        return self.get_state(descriptor)

    def get_reducing_state(self, descriptor: ReducingStateDescriptor[T]) -> ReducingState[T]:
        return self.get_state(descriptor)


class TimeDomain(Enum):
    """Which clock a timer was set on."""

    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


class TimerService(Protocol):
    """Timers of the current key, in milliseconds (Flink's ``TimerService``).

    Timers are keyed state: they are in every checkpoint and savepoint and fire
    after a restore. Registering the same (key, time) twice sets one timer.
    """

    def register_event_time_timer(self, timestamp: int) -> None:
        """Fire ``on_timer`` once the watermark reaches ``timestamp``."""
        ...

    def register_processing_time_timer(self, timestamp: int) -> None:
        """Fire ``on_timer`` once the (injected) wall clock reaches ``timestamp``."""
        ...

    def delete_event_time_timer(self, timestamp: int) -> None: ...

    def delete_processing_time_timer(self, timestamp: int) -> None: ...

    def current_watermark(self) -> int: ...

    def current_processing_time(self) -> int: ...


class Context:
    """Per-record context of a process function.

    ``current_key`` is a plain attribute the operator sets with the state
    backend's key before each call: read once or more per record, it must
    cost a slot load, not a property call.
    """

    __slots__ = ("_broadcast", "_side", "_timers", "current_key")

    def __init__(
        self,
        timers: TimerService | None = None,
        side_output: list[tuple[Any, Any]] | None = None,
        broadcast: BroadcastStates | None = None,
    ) -> None:
        self.current_key: Any = None
        self._timers = timers
        self._side = side_output
        self._broadcast = broadcast

    def output(self, tag: OutputTag[Any], value: Any) -> None:
        """Emit ``value`` to side output ``tag`` (read by ``stream.get_side_output(tag)``).

        Side records travel with the main output, between the same barriers,
        so they are exactly-once like it. Nothing reads the tag: dropped, as
        in Flink.
        """
        side = self._side
        if side is not None:
            side.append((tag, value))

    def get_broadcast_state(self, descriptor: MapStateDescriptor[K, V]) -> MapState[K, V]:
        """Return the broadcast state of ``descriptor``.

        Writable on the broadcast side only: elsewhere ``put``/``remove``/``clear``
        raise, as every instance must keep the same maps.
        """
        if self._broadcast is None:
            raise TypeError(
                "broadcast state needs a (Keyed)BroadcastProcessFunction on a stream connected "
                "to stream.broadcast(descriptor)"
            )
        return self._broadcast.get(descriptor)

    def timer_service(self) -> TimerService:
        """Event- and processing-time timers of the current key."""
        if self._timers is None:
            raise TypeError(
                "timers need a KeyedProcessFunction that overrides on_timer, run by "
                "key_by(...).process(...)"
            )
        return self._timers


class OnTimerContext(Context):
    """Context of :meth:`KeyedProcessFunction.on_timer`: the key and the timer's clock."""

    __slots__ = ("time_domain",)

    def __init__(
        self,
        timers: TimerService | None,
        time_domain: TimeDomain = TimeDomain.EVENT_TIME,
        side_output: list[tuple[Any, Any]] | None = None,
        broadcast: BroadcastStates | None = None,
    ) -> None:
        super().__init__(timers, side_output, broadcast)
        self.time_domain = time_domain


class ProcessFunction(Generic[IN, OUT]):
    """Low-level per-record function on a non-keyed stream (no keyed state)."""

    def open(self, ctx: RuntimeContext) -> None:
        """Prepare the instance (get state) before its first record."""

    def process_element(self, value: IN, ctx: Context, out: Collector[OUT]) -> None:
        """Handle one record; emit any number of records with ``out.collect``."""
        raise TypeError(f"{type(self).__name__} must override process_element")

    def close(self) -> None:
        """Release resources when the instance stops (also on failure)."""


class KeyedProcessFunction(ProcessFunction[IN, OUT]):
    """Per-record function on a keyed stream, with keyed state.

    Example: a running count per key.

    >>> from aiostream_ckpt.state.descriptors import ValueStateDescriptor
    >>> class CountPerKey(KeyedProcessFunction):
    ...     def open(self, ctx):
    ...         self.count = ctx.get_state(ValueStateDescriptor("count", default=0))
    ...     def process_element(self, value, ctx, out):
    ...         n = self.count.value() + 1
    ...         self.count.update(n)
    ...         out.collect((ctx.current_key, n))

    Timers (``ctx.timer_service()``) are available when the function overrides
    :meth:`on_timer`; they are checkpointed with the keyed state.
    """

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector[OUT]) -> None:
        """Handle a timer of ``ctx.current_key`` set for ``timestamp`` (``ctx.time_domain``)."""
