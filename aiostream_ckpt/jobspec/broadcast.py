"""Broadcast state: a low-volume stream (rules, thresholds) shared by every instance.

``rules.broadcast(descriptor)`` makes a :class:`BroadcastStream`; connecting a
stream to it (``events.connect(rules_bc)``, or ``events.key_by(f).connect(...)``)
and ``.process(fn)`` runs ``fn`` with the broadcast stream's every record sent
to every instance, which writes it into *broadcast state*: one map per
:class:`~aiostream_ckpt.state.descriptors.MapStateDescriptor`, the same in
every instance (Flink's ``BroadcastProcessFunction``).

Snapshot/restore contract: broadcast state is written only by
:meth:`BroadcastProcessFunction.process_broadcast_element`; the other side
(``process_element``, ``on_timer``) reads it and gets an error if it writes, so
every instance holds the same map after the same broadcast records. A barrier
is aligned over both inputs, so at checkpoint ``n`` every instance has seen the
same broadcast records: the state is written into the checkpoint once (by
instance 0) and restored into every instance, at any parallelism. When the
broadcast stream has several instances, the order in which their records
arrive differs between instances: updates must not depend on it (keep one
writer per entry, e.g. by partitioning rules by id upstream).
Keyed state (``key_by`` first) is checkpointed as for a keyed process function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from aiostream_ckpt.jobspec.functions import Collector, Context, OnTimerContext, RuntimeContext
from aiostream_ckpt.state.descriptors import MapStateDescriptor

IN1 = TypeVar("IN1")
IN2 = TypeVar("IN2")
OUT = TypeVar("OUT")


class BroadcastProcessFunction(Generic[IN1, IN2, OUT]):
    """Records of a stream, with read access to the state its broadcast side writes.

    >>> from aiostream_ckpt.api.environment import StreamEnvironment
    >>> from aiostream_ckpt.state.descriptors import MapStateDescriptor
    >>> LIMITS = MapStateDescriptor("limits", str, int)
    >>> class OverLimit(BroadcastProcessFunction):
    ...     def process_element(self, value, ctx, out):
    ...         limit = ctx.get_broadcast_state(LIMITS).get("max")
    ...         out.collect((value, limit is not None and value > limit))
    ...     def process_broadcast_element(self, value, ctx, out):
    ...         ctx.get_broadcast_state(LIMITS).put("max", value)
    >>> env = StreamEnvironment("doc")
    >>> limits = env.from_collection([10], uid="limits").broadcast(LIMITS)
    >>> s = env.from_collection([5, 50], uid="values").connect(limits)
    >>> r = env.execute_and_collect(s.process(OverLimit(), uid="check"))
    >>> all(len(x) == 2 for x in r)  # whether the limit arrived first is up to the scheduler
    True
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Prepare the instance (get keyed state) before its first record."""

    def process_element(self, value: IN1, ctx: Context, out: Collector[OUT]) -> None:
        """Handle a record of the (keyed) stream; broadcast state is read-only here."""
        raise TypeError(f"{type(self).__name__} must override process_element")

    def process_broadcast_element(self, value: IN2, ctx: Context, out: Collector[OUT]) -> None:
        """Handle a broadcast record (every instance gets each); write broadcast state here."""
        raise TypeError(f"{type(self).__name__} must override process_broadcast_element")

    def close(self) -> None:
        """Release resources when the instance stops (also on failure)."""


class KeyedBroadcastProcessFunction(BroadcastProcessFunction[IN1, IN2, OUT]):
    """The keyed side has keyed state and timers; ``on_timer`` reads broadcast state too.

    ``process_broadcast_element`` runs outside of any key (``ctx.current_key``
    is None): it must not read or write keyed state directly, but
    ``ctx.apply_to_keyed_state(descriptor, fn)`` calls ``fn(key, state)`` for
    every key of the instance that has that state (e.g. a withdrawn rule
    clears what each account kept for it).
    """

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector[OUT]) -> None:
        """Handle a timer of ``ctx.current_key`` set for ``timestamp``."""


@dataclass(frozen=True)
class BroadcastSpec:
    """What ``connect(broadcast).process`` asked for (the job graph builds the operator)."""

    function: BroadcastProcessFunction[Any, Any, Any]
    descriptors: tuple[MapStateDescriptor[Any, Any], ...]
    #: The keyed side's selector (None: not keyed); the broadcast side has none.
    key_selectors: tuple[Callable[[Any], Any] | None, None] = (None, None)
