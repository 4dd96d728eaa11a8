"""``stream.broadcast(descriptor)`` and ``connect(broadcast).process``: the fluent half.

The functions and the contract of broadcast state: :mod:`aiostream_ckpt.jobspec.broadcast`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from aiostream_ckpt.errors import JobGraphError
from aiostream_ckpt.jobspec.broadcast import (
    BroadcastProcessFunction,
    BroadcastSpec,
    KeyedBroadcastProcessFunction,
)
from aiostream_ckpt.jobspec.graph import Partitioning, TransformKind
from aiostream_ckpt.state.descriptors import MapStateDescriptor

if TYPE_CHECKING:
    from aiostream_ckpt.api.stream import Stream

IN1 = TypeVar("IN1")
IN2 = TypeVar("IN2")
R = TypeVar("R")


class BroadcastStream(Generic[IN2]):
    """A stream whose records go to every instance of the operator it is connected to."""

    def __init__(self, stream: Stream[IN2], descriptors: tuple[MapStateDescriptor[Any, Any], ...]):
        if not descriptors:
            raise JobGraphError("broadcast state needs at least one MapStateDescriptor")
        names = [d.name for d in descriptors]
        bad = [d for d in descriptors if not isinstance(d, MapStateDescriptor)]
        if bad or len(set(names)) != len(names):
            raise JobGraphError(
                f"broadcast(...) takes MapStateDescriptors with distinct names, got {descriptors!r}"
            )
        self.stream = stream
        self.descriptors = descriptors


class BroadcastConnectedStream(Generic[IN1, IN2]):
    """A stream connected to a :class:`BroadcastStream`; ``process`` runs the function."""

    def __init__(
        self,
        first: Stream[IN1],
        broadcast: BroadcastStream[IN2],
        key_selector: Callable[[IN1], Any] | None,
        key_type: Any = None,
    ) -> None:
        self._first = first
        self._broadcast = broadcast
        self._key_selector = key_selector
        self._key_type = key_type  # the keyed stream's key_by(..., key_type=)

    def process(
        self,
        function: BroadcastProcessFunction[IN1, IN2, R],
        *,
        name: str = "broadcast_process",
        uid: str | None = None,
        parallelism: int | None = None,
    ) -> Stream[R]:
        """Run ``function`` (keyed stream: a :class:`KeyedBroadcastProcessFunction`)."""
        keyed = self._key_selector is not None
        if keyed != isinstance(function, KeyedBroadcastProcessFunction):
            need = "KeyedBroadcastProcessFunction" if keyed else "BroadcastProcessFunction"
            how = "a keyed stream" if keyed else "a stream that is not keyed"
            raise JobGraphError(
                f"{type(function).__name__}: {how} connected to a broadcast stream needs a "
                f"{need} (key_by(...) before connect(...) gives keyed state and timers)"
            )
        node = self._first._env._add_transformation(
            TransformKind.KEYED_BROADCAST_PROCESS if keyed else TransformKind.BROADCAST_PROCESS,
            name,
            fn=BroadcastSpec(function, self._broadcast.descriptors, (self._key_selector, None)),
            uid=uid,
            parallelism=parallelism,
            partitioning=Partitioning.HASH if keyed else Partitioning.FORWARD,
            key_type=self._key_type,
            inputs=[self._first._node, self._broadcast.stream._node],
        )
        return self._first._stream(node)
