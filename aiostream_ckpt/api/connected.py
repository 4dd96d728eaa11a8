"""``a.connect(b)``: two streams, possibly of different types, into one two-input operator."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from aiostream_ckpt.jobspec.co_functions import CoProcessFunction, CoSpec, KeyedCoProcessFunction
from aiostream_ckpt.jobspec.graph import Partitioning, TransformKind
from aiostream_ckpt.state.codecs import StreamKeyCodec

if TYPE_CHECKING:
    from aiostream_ckpt.api.stream import Stream

IN1 = TypeVar("IN1")
IN2 = TypeVar("IN2")
R = TypeVar("R")


class ConnectedStreams(Generic[IN1, IN2]):
    """Two streams whose records one operator handles, each with its own method.

    ``key_by(key1, key2)`` partitions both so equal keys meet in one instance
    and share its keyed state (a :class:`KeyedCoProcessFunction`).
    """

    def __init__(
        self,
        first: Stream[IN1],
        second: Stream[IN2],
        keys: tuple[Callable[[IN1], Any], Callable[[IN2], Any]] | None = None,
        key_type: Any = None,
    ) -> None:
        if key_type is not None:
            StreamKeyCodec(key_type)  # an unsupported type fails here, where it is declared
        self._first = first
        self._second = second
        self._keys = keys
        self._key_type = key_type

    def key_by(
        self, key1: Callable[[IN1], Any], key2: Callable[[IN2], Any], *, key_type: Any = None
    ) -> ConnectedStreams[IN1, IN2]:
        """Partition the first stream by ``key1`` and the second by ``key2``.

        Both give keys of one type (equal keys meet): ``key_type`` declares it
        as ``Stream.key_by(selector, key_type=...)`` does (an enum, a date, a
        tuple of those come back as themselves in timers and after a restore).
        """
        return ConnectedStreams(self._first, self._second, (key1, key2), key_type)

    def process(
        self,
        function: CoProcessFunction[IN1, IN2, R],
        *,
        name: str = "co_process",
        uid: str | None = None,
        parallelism: int | None = None,
    ) -> Stream[R]:
        """Run ``function`` on both streams (keyed: needs a :class:`KeyedCoProcessFunction`)."""
        keyed = self._keys is not None
        if keyed and not isinstance(function, KeyedCoProcessFunction):
            raise TypeError("connect(...).key_by(...).process needs a KeyedCoProcessFunction")
        if not keyed and isinstance(function, KeyedCoProcessFunction):
            raise TypeError(
                "a KeyedCoProcessFunction needs connect(...).key_by(key1, key2) first, "
                "so that it gets keyed state"
            )
        node = self._first._env._add_transformation(
            TransformKind.KEYED_CO_PROCESS if keyed else TransformKind.CO_PROCESS,
            name,
            fn=CoSpec(function, self._keys),
            uid=uid,
            parallelism=parallelism,
            partitioning=Partitioning.HASH if keyed else Partitioning.FORWARD,
            key_type=self._key_type,
            inputs=[self._first._node, self._second._node],
        )
        return self._first._stream(node)
