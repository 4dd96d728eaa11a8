"""The typed, fluent stream API.

A :class:`Stream` is a handle on a node of the logical graph; every call adds
a transformation and returns a new handle. Nothing runs until the job is
executed. Stateful operators should be given an explicit ``uid``: checkpoints
and savepoints match state to operators by uid. Without one, a uid is derived
from the operator's name and its position among same-named operators
(``count``, ``count-2``...), which changes if the app inserts an operator of
the same name before it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import orjson

from aiostream_ckpt.api.broadcast import BroadcastConnectedStream, BroadcastStream
from aiostream_ckpt.api.connected import ConnectedStreams
from aiostream_ckpt.api.interval_join import IntervalJoin
from aiostream_ckpt.api.windowed_stream import WindowedStream
from aiostream_ckpt.connectors.base import Sink
from aiostream_ckpt.connectors.kafka.sink import KafkaSink
from aiostream_ckpt.connectors.kafka.source import KafkaSource
from aiostream_ckpt.connectors.key_grouped import KeyGroupPartitioner
from aiostream_ckpt.connectors.stdout import StdoutSink
from aiostream_ckpt.errors import JobGraphError
from aiostream_ckpt.jobspec.async_functions import (
    AsyncFunction,
    AsyncRetry,
    AsyncSpec,
    KeyedAsyncFunction,
    as_async_function,
)
from aiostream_ckpt.jobspec.functions import KeyedProcessFunction, OutputTag, ProcessFunction
from aiostream_ckpt.jobspec.graph import Partitioning, Transformation, TransformKind, UserFunction
from aiostream_ckpt.jobspec.windows import WindowAssigner
from aiostream_ckpt.state.codecs import StreamKeyCodec
from aiostream_ckpt.state.descriptors import MapStateDescriptor

if TYPE_CHECKING:
    from aiostream_ckpt.api.environment import StreamEnvironment

T = TypeVar("T")
R = TypeVar("R")
K = TypeVar("K")


class Stream(Generic[T]):
    """A stream of records of type ``T``.

    >>> from aiostream_ckpt.api.environment import StreamEnvironment
    >>> env = StreamEnvironment("doc")
    >>> s = env.from_collection([1, 2, 3, 4]).map(lambda x: x * 10).filter(lambda x: x > 10)
    >>> env.execute_and_collect(s)
    [20, 30, 40]
    """

    def __init__(self, env: StreamEnvironment, node: Transformation) -> None:
        self._env = env
        self._node = node

    @property
    def transformation(self) -> Transformation:
        return self._node

    def _add(
        self,
        kind: TransformKind,
        name: str,
        *,
        fn: UserFunction = None,
        uid: str | None = None,
        parallelism: int | None = None,
        partitioning: Partitioning = Partitioning.FORWARD,
        key_selector: Callable[[Any], Any] | None = None,
        key_type: Any = None,
        inputs: list[Transformation] | None = None,
        state_type: Any = None,
    ) -> Transformation:
        return self._env._add_transformation(
            kind,
            name,
            fn=fn,
            uid=uid,
            parallelism=parallelism,
            partitioning=partitioning,
            key_selector=key_selector,
            key_type=key_type,
            inputs=inputs if inputs is not None else [self._node],
            state_type=state_type,
        )

    def _stream(self, node: Transformation) -> Stream[Any]:
        """Wrap ``node`` in a handle on this stream's environment."""
        return Stream(self._env, node)

    if not TYPE_CHECKING:  # the type checker already refuses these on a Stream

        def __getattr__(self, name: str) -> Any:
            """Say what a keyed-only operator needs, instead of a bare AttributeError."""
            if name in _KEYED_ONLY:
                raise AttributeError(
                    f"{name}() works per key, on a KeyedStream: call "
                    f".key_by(lambda record: <its key>).{name}(...) first "
                    f"({_KEYED_ONLY[name]})",
                    name=name,
                    obj=self,
                )
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self
            )

    def map(
        self,
        fn: Callable[[T], R],
        *,
        name: str = "map",
        uid: str | None = None,
        parallelism: int | None = None,
    ) -> Stream[R]:
        """Apply ``fn`` to every record."""
        return Stream(
            self._env, self._add(TransformKind.MAP, name, fn=fn, uid=uid, parallelism=parallelism)
        )

    def map_async(
        self,
        fn: Callable[[T], Awaitable[R]] | AsyncFunction[T, R],
        *,
        capacity: int = 100,
        timeout: float | None = None,
        ordered: bool = True,
        retry: AsyncRetry | None = None,
        serializer: str = "json",
        name: str = "map_async",
        uid: str | None = None,
        parallelism: int | None = None,
    ) -> Stream[R]:
        """Apply an ``async def`` or :class:`AsyncFunction`, ``capacity`` calls in flight at most.

        ``ordered=False`` emits results as they arrive (never across a
        watermark or barrier). ``timeout`` (seconds) bounds a record's calls,
        retries included; ``retry`` retries failed calls. A call that fails
        for good goes to ``errors.on_process_error`` (fail, or dead-letter
        it). Records in flight at a checkpoint are in it and are issued again
        after a restore (``serializer``: ``json`` or ``pickle`` for them);
        results are emitted exactly once. See :mod:`aiostream_ckpt.jobspec.async_functions`.

        >>> import asyncio
        >>> from aiostream_ckpt.api.environment import StreamEnvironment
        >>> async def lookup(x):
        ...     await asyncio.sleep(0.001 * (5 - x))
        ...     return {"id": x, "sq": x * x}
        >>> env = StreamEnvironment("doc")
        >>> s = env.from_collection([1, 2, 3, 4]).map_async(lookup, capacity=4, uid="lookup")
        >>> env.execute_and_collect(s)
        [{'id': 1, 'sq': 1}, {'id': 2, 'sq': 4}, {'id': 3, 'sq': 9}, {'id': 4, 'sq': 16}]
        """
        spec = AsyncSpec(as_async_function(fn), capacity, timeout, ordered, retry, serializer)
        if isinstance(spec.function, KeyedAsyncFunction) and self._connect_key() is None:
            raise JobGraphError(
                f"{type(spec.function).__name__} is a KeyedAsyncFunction: run it on a keyed "
                "stream, key_by(...).map_async(...), so that it gets keyed state"
            )
        node = self._add(TransformKind.ASYNC_MAP, name, fn=spec, uid=uid, parallelism=parallelism)
        return Stream(self._env, node)

    def flat_map(
        self,
        fn: Callable[[T], Iterable[R]],
        *,
        name: str = "flat_map",
        uid: str | None = None,
        parallelism: int | None = None,
    ) -> Stream[R]:
        """Replace every record by the records ``fn`` returns (zero or more)."""
        node = self._add(TransformKind.FLAT_MAP, name, fn=fn, uid=uid, parallelism=parallelism)
        return Stream(self._env, node)

    def filter(
        self,
        fn: Callable[[T], bool],
        *,
        name: str = "filter",
        uid: str | None = None,
        parallelism: int | None = None,
    ) -> Stream[T]:
        """Keep the records for which ``fn`` is true."""
        node = self._add(TransformKind.FILTER, name, fn=fn, uid=uid, parallelism=parallelism)
        return Stream(self._env, node)

    def process(
        self,
        function: ProcessFunction[T, R],
        *,
        name: str = "process",
        uid: str | None = None,
        parallelism: int | None = None,
    ) -> Stream[R]:
        """Run a :class:`ProcessFunction` on every record (no keyed state)."""
        _check_process_function(function)
        if isinstance(function, KeyedProcessFunction):
            raise JobGraphError(
                f"{type(function).__name__} is a KeyedProcessFunction: run it on a keyed "
                "stream, key_by(...).process(...), so that it gets keyed state"
            )
        node = self._add(TransformKind.PROCESS, name, fn=function, uid=uid, parallelism=parallelism)
        return Stream(self._env, node)

    @overload
    def connect(self, other: BroadcastStream[R]) -> BroadcastConnectedStream[T, R]: ...

    @overload
    def connect(self, other: Stream[R]) -> ConnectedStreams[T, R]: ...

    def connect(
        self, other: Stream[R] | BroadcastStream[R]
    ) -> ConnectedStreams[T, R] | BroadcastConnectedStream[T, R]:
        """Connect ``other`` for a two-input operator (``.process(CoProcessFunction)``).

        ``other`` made by ``stream.broadcast(descriptor)``: ``.process`` takes a
        (Keyed)BroadcastProcessFunction with broadcast state (see
        :mod:`~aiostream_ckpt.jobspec.broadcast`).
        """
        if isinstance(other, BroadcastStream):
            if isinstance(self, KeyedStream):
                self._refuse_reinterpreted("connect(broadcast stream)")
                return BroadcastConnectedStream(self, other, self.key_selector, self.key_type)
            return BroadcastConnectedStream(self, other, None)
        return ConnectedStreams(self, other)

    def _connect_key(self) -> Callable[[Any], Any] | None:
        return None

    def key_by(
        self, key_selector: Callable[[T], K], *, key_type: type[K] | Any = None
    ) -> KeyedStream[T, K]:
        """Partition by key: records with equal keys go to the same instance and state.

        Keys are stored (and hashed to key groups) as their JSON bytes. Undeclared,
        a key must be a ``str``, ``int``, ``bool``, ``None``, finite ``float`` or a
        tuple of those (anything else is refused at its first state access: it
        would come back as another type after a restore). ``key_type`` declares
        another: an enum, ``date``/``datetime``, a frozen dataclass, a tuple of
        those (``tuple[Color, date]``); such keys come back as themselves after
        a restore, in timers, ``ctx.current_key`` and window results.

        >>> import enum
        >>> from aiostream_ckpt.api.environment import StreamEnvironment
        >>> class Color(enum.Enum):
        ...     RED = "red"
        >>> env = StreamEnvironment("doc")
        >>> s = env.from_collection([("red", 1), ("red", 2)])
        >>> r = s.key_by(lambda t: Color(t[0]), key_type=Color).reduce(
        ...     lambda x, y: (x[0], x[1] + y[1]), uid="sum", value_type=tuple[str, int]
        ... )
        >>> env.execute_and_collect(r)
        [('red', 1), ('red', 3)]
        """
        return KeyedStream(self._env, self._node, key_selector, key_type=key_type)

    def reinterpret_as_keyed(
        self, key_selector: Callable[[T], K], *, key_type: type[K] | Any = None
    ) -> KeyedStream[T, K]:
        """Declare this stream already partitioned by ``key_selector``: keyed, without a shuffle.

        Flink's ``DataStreamUtils.reinterpretAsKeyedStream``. The next
        operator is keyed (state, timers, windows) but connected forward,
        chained to this stream's task where chaining allows, at the same
        parallelism: no record crosses a partitioner, a channel or (with
        worker processes) a process. Use it on input whose splits line up
        with key groups (``JsonLinesFileSource(..., key_grouped=True)``,
        ``KafkaSource(..., key_grouped=True)``), or after a keyed operator
        with the same key and parallelism.

        Why it stays exactly-once: keyed state is stored by key group, so a
        record must reach the instance that owns its key's group. Each
        instance checks every record's key against its key groups on
        arrival (once per distinct key; the result is cached) and fails the
        job with a :class:`~aiostream_ckpt.errors.PartitioningError` naming
        the key, its key group, the owning instance and the split, before
        the record touches state. Flink leaves a wrong declaration undefined.

        >>> from aiostream_ckpt.api.environment import StreamEnvironment
        >>> env = StreamEnvironment("doc")
        >>> s = env.from_collection([("a", 1), ("b", 5), ("a", 2)])
        >>> r = s.reinterpret_as_keyed(lambda t: t[0]).reduce(
        ...     lambda x, y: (x[0], x[1] + y[1]), uid="sum", value_type=tuple[str, int]
        ... )
        >>> env.execute_and_collect(r)
        [('a', 1), ('b', 5), ('a', 3)]
        """
        return KeyedStream(
            self._env, self._node, key_selector, Partitioning.FORWARD_KEYED, key_type=key_type
        )

    def through(
        self,
        topic: str,
        bootstrap_servers: str,
        key: Callable[[Any], K],
        *,
        key_type: type[K] | Any = None,
        uid: str | None = None,
        parallelism: int | None = None,
        serializer: Callable[[Any], bytes] = orjson.dumps,
        deserializer: Callable[[bytes], Any] = orjson.loads,
        producer_config: dict[str, Any] | None = None,
        consumer_config: dict[str, Any] | None = None,
        transactional_id_prefix: str | None = None,
    ) -> KeyedStream[Any, K]:
        """Repartition by another key through a Kafka topic: Kafka Streams' repartition topic.

        The records go into ``topic`` (it must exist) by key group of ``key``,
        exactly-once (a :class:`~aiostream_ckpt.connectors.kafka.sink.KafkaSink`
        in transactions committed with each checkpoint), and are read back
        ``read_committed`` as key-grouped input, keyed by ``key`` without a
        further shuffle: the returned stream is ``reinterpret_as_keyed(key)``.
        It is how a sharded job (``--shard I/N``) keys by another key than its
        input is partitioned by: each shard writes every record to the
        partition of its new key's shard and reads only its own partitions
        (a ``key_by`` on another key fails there, naming the shard). It works
        unsharded too, as one more stage.

        Each hop stays exactly-once: the first stage's records reach the
        topic in the transaction of the checkpoint that covers them (a
        restore replays the others into new transactions; aborted ones are
        never read), and the second stage's offsets in the topic are in the
        same checkpoints as its state. The topic needs as many partitions as
        the key-grouped rules ask: each partition in one shard, and in one
        subtask of it (``job.parallelism`` 1 and 2 shards: 2 or 4 partitions).
        Records travel as ``serializer`` bytes (JSON: tuples come back as
        lists). The topic is read without end, so a job with ``through``
        runs until it is stopped. ``uid`` names the two ends: ``<uid>-write``
        and ``<uid>-read`` (default ``through-<topic>``).
        """
        name = uid or f"through-{topic}"
        maxp = self._env.config.max_parallelism
        sink = KafkaSink(
            topic,
            bootstrap_servers,
            semantic="exactly_once",
            partitioner=KeyGroupPartitioner(key, maxp),
            serializer=serializer,
            producer_config=producer_config,
            transactional_id_prefix=transactional_id_prefix,
            name=f"{name}-write",
        )
        self.sink_to(sink, uid=f"{name}-write", parallelism=parallelism)
        source = KafkaSource(
            topic,
            bootstrap_servers,
            deserializer=deserializer,
            consumer_config=consumer_config,
            key_grouped=True,
            name=f"{name}-read",
        )
        read = self._env.from_source(source, uid=f"{name}-read", parallelism=parallelism)
        return read.reinterpret_as_keyed(key, key_type=key_type)

    def rebalance(self) -> Stream[T]:
        """Spread batches round-robin over the next operator's instances."""
        return _Repartitioned(self._env, self._node, Partitioning.REBALANCE)

    @overload
    def broadcast(self) -> Stream[T]: ...

    @overload
    def broadcast(
        self, descriptor: MapStateDescriptor[Any, Any], /, *more: MapStateDescriptor[Any, Any]
    ) -> BroadcastStream[T]: ...

    def broadcast(
        self, *descriptors: MapStateDescriptor[Any, Any]
    ) -> Stream[T] | BroadcastStream[T]:
        """Send every record to every instance of the next operator.

        With descriptors: a :class:`~aiostream_ckpt.api.broadcast.BroadcastStream`
        to ``connect`` to, whose function keeps those maps as broadcast state.
        """
        if descriptors:
            return BroadcastStream(self, descriptors)
        return _Repartitioned(self._env, self._node, Partitioning.BROADCAST)

    def union(self, *others: Stream[T]) -> Stream[T]:
        """Merge streams of the same type (no order between them)."""
        inputs = [self._node, *(o._node for o in others)]
        node = self._env._add_transformation(
            TransformKind.UNION, "union", inputs=inputs, partitioning=Partitioning.FORWARD
        )
        return Stream(self._env, node)

    def sink_to(
        self,
        sink: Sink,
        *,
        name: str | None = None,
        uid: str | None = None,
        parallelism: int | None = None,
    ) -> Transformation:
        """Write the stream to ``sink`` (two-phase commit when the sink supports it)."""
        return self._add(
            TransformKind.SINK,
            name or sink.name,
            fn=sink,
            uid=uid,
            parallelism=parallelism,
        )

    def get_side_output(self, tag: OutputTag[R]) -> Stream[R]:
        """Read the records this operator sends to side output ``tag`` (e.g. late data)."""
        node = self._env._add_transformation(
            TransformKind.SIDE_OUTPUT,
            f"side-{tag.id}",
            fn=tag,
            parallelism=self._node.parallelism,
            inputs=[self._node],
        )
        return Stream(self._env, node)

    def print(self, *, name: str = "stdout") -> Transformation:
        """Print records as JSON lines (for development)."""
        return self.sink_to(StdoutSink(name=name))


#: operators a KeyedStream has and a Stream has not -> why they need a key
_KEYED_ONLY = {
    "window": "a window holds the records of one key between its start and end",
    "reduce": "the folded value is kept per key",
    "interval_join": "records of both sides meet by key and event time",
}


class _Repartitioned(Stream[T]):
    """A stream whose next operator is connected with a given partitioning."""

    def __init__(self, env: StreamEnvironment, node: Transformation, how: Partitioning) -> None:
        super().__init__(env, node)
        self._how = how

    def _add(self, kind: TransformKind, name: str, **kw: Any) -> Transformation:
        kw["partitioning"] = self._how
        return super()._add(kind, name, **kw)


class KeyedStream(Stream[T], Generic[T, K]):
    """A stream partitioned by key; the next operator may use keyed state."""

    def __init__(
        self,
        env: StreamEnvironment,
        node: Transformation,
        key_selector: Callable[[T], K],
        partitioning: Partitioning = Partitioning.HASH,
        *,
        key_type: Any = None,
    ) -> None:
        super().__init__(env, node)
        if key_type is not None:
            StreamKeyCodec(key_type)  # an unsupported type fails here, where it is declared
        self._key_selector = key_selector
        self._key_type = key_type
        #: HASH after ``key_by``; FORWARD_KEYED after ``reinterpret_as_keyed``.
        self._partitioning = partitioning

    def _add(self, kind: TransformKind, name: str, **kw: Any) -> Transformation:
        kw["partitioning"] = self._partitioning
        kw["key_selector"] = self._key_selector
        kw["key_type"] = self._key_type
        return super()._add(kind, name, **kw)

    def _refuse_reinterpreted(self, what: str) -> None:
        """Two-input operators shuffle each input by its own key: not without a shuffle yet."""
        if self._partitioning is Partitioning.FORWARD_KEYED:
            raise JobGraphError(
                f"{what} on a stream from reinterpret_as_keyed is not supported: its "
                "inputs are shuffled by key; use key_by(...) on both inputs"
            )

    @property
    def key_selector(self) -> Callable[[T], K]:
        return self._key_selector

    @property
    def key_type(self) -> Any:
        """The type ``key_by(..., key_type=)`` declared (None: undeclared)."""
        return self._key_type

    def _connect_key(self) -> Callable[[Any], Any] | None:
        return self._key_selector

    def interval_join(self, other: KeyedStream[R, K]) -> IntervalJoin[T, R]:
        """Join with ``other`` on key and event time: ``.between(lower, upper).process(fn)``.

        See :mod:`aiostream_ckpt.jobspec.interval_join`.
        """
        self._refuse_reinterpreted("interval_join")
        if not isinstance(other, KeyedStream):
            raise JobGraphError(
                "interval_join needs the other stream keyed too: "
                "left.key_by(f).interval_join(right.key_by(g))"
            )
        other._refuse_reinterpreted("interval_join")
        return IntervalJoin(self, other)

    def process(  # type: ignore[override]
        self,
        function: KeyedProcessFunction[T, R],
        *,
        name: str = "process",
        uid: str | None = None,
        parallelism: int | None = None,
    ) -> Stream[R]:
        """Run a :class:`KeyedProcessFunction` with keyed state on every record."""
        _check_process_function(function)
        node = self._add(
            TransformKind.KEYED_PROCESS, name, fn=function, uid=uid, parallelism=parallelism
        )
        return Stream(self._env, node)

    def window(
        self,
        assigner: WindowAssigner,
        *,
        timestamp_assigner: Callable[[T], int] | None = None,
    ) -> WindowedStream[T, K]:
        """Cut each key's records into event-time windows (see :class:`WindowedStream`).

        Timestamps come from the upstream source's watermark strategy unless
        ``timestamp_assigner`` is given.
        """
        return WindowedStream(self, assigner, timestamp_assigner)

    def reduce(
        self,
        fn: Callable[[T, T], T],
        *,
        name: str = "reduce",
        uid: str | None = None,
        parallelism: int | None = None,
        value_type: Any = None,
    ) -> Stream[T]:
        """Fold records per key with ``fn``; emits the updated value for every record.

        The folded value lives in keyed state: declare ``value_type`` when it is
        not plain JSON (a tuple, a dataclass), so it reads back as such after a
        restore (see :mod:`~aiostream_ckpt.state.codecs`).

        >>> from aiostream_ckpt.api.environment import StreamEnvironment
        >>> env = StreamEnvironment("doc")
        >>> s = env.from_collection([("a", 1), ("b", 5), ("a", 2)])
        >>> r = s.key_by(lambda t: t[0]).reduce(
        ...     lambda x, y: (x[0], x[1] + y[1]), uid="sum", value_type=tuple[str, int]
        ... )
        >>> env.execute_and_collect(r)
        [('a', 1), ('b', 5), ('a', 3)]
        """
        node = self._add(
            TransformKind.REDUCE,
            name,
            fn=fn,
            uid=uid,
            parallelism=parallelism,
            state_type=value_type,
        )
        return Stream(self._env, node)


def _check_process_function(function: ProcessFunction[Any, Any]) -> None:
    """Refuse a ``process_element`` that yields: its body would never run, its output be lost."""
    if inspect.isgeneratorfunction(type(function).process_element):
        raise JobGraphError(
            f"{type(function).__name__}.process_element is a generator (it uses yield): it "
            "would never run; emit records with out.collect(record) instead"
        )
