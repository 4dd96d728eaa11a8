"""The job description: one frozen :class:`Transformation` per API call, in a :class:`JobSpec`.

:class:`~aiostream_ckpt.api.environment.StreamEnvironment` builds it; the
runtime plans and runs it and never sees the builder. A spec holds only
descriptions (functions, sources and sinks as the app wrote them, settings),
no running object, so any process that imports the app can build the same
spec again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from aiostream_ckpt.connectors.base import Sink, Source
from aiostream_ckpt.errors import JobGraphError
from aiostream_ckpt.jobspec.async_functions import AsyncSpec
from aiostream_ckpt.jobspec.broadcast import BroadcastSpec
from aiostream_ckpt.jobspec.co_functions import CoSpec
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.jobspec.functions import OutputTag, ProcessFunction
from aiostream_ckpt.jobspec.watermarks import TimestampAssigner, WatermarkStrategy
from aiostream_ckpt.jobspec.window_functions import ProcessWindowFunction, WindowFunction
from aiostream_ckpt.jobspec.windows import WindowAssigner
from aiostream_ckpt.state.descriptors import Serializer

P = TypeVar("P")


class TransformKind(Enum):
    SOURCE = "source"
    MAP = "map"
    ASYNC_MAP = "async_map"
    FLAT_MAP = "flat_map"
    FILTER = "filter"
    PROCESS = "process"
    KEYED_PROCESS = "keyed_process"
    CO_PROCESS = "co_process"
    KEYED_CO_PROCESS = "keyed_co_process"
    BROADCAST_PROCESS = "broadcast_process"
    KEYED_BROADCAST_PROCESS = "keyed_broadcast_process"
    REDUCE = "reduce"
    UNION = "union"
    SINK = "sink"
    WINDOW = "window"
    SIDE_OUTPUT = "side_output"


class Partitioning(Enum):
    """How records travel from an operator's inputs to its instances."""

    FORWARD = "forward"
    #: Forward, to a keyed operator: the input is already partitioned by key
    #: group (``reinterpret_as_keyed``), so no shuffle; every record's key is
    #: checked against the instance's key groups on arrival.
    FORWARD_KEYED = "forward_keyed"
    HASH = "hash"
    REBALANCE = "rebalance"
    BROADCAST = "broadcast"


class WindowKind(Enum):
    AGGREGATE = "aggregate"
    REDUCE = "reduce"
    PROCESS = "process"


@dataclass(frozen=True)
class WindowSpec:
    """What ``key_by(...).window(...)`` asked for; the runtime builds its operator."""

    assigner: WindowAssigner
    kind: WindowKind
    timestamp_assigner: TimestampAssigner
    function: WindowFunction  # which of them: ``kind``
    window_function: ProcessWindowFunction[Any, Any, Any] | None = None
    allowed_lateness: int = 0
    late_tag: OutputTag[Any] | None = None
    serializer: Serializer = "json"
    #: Declared type of one window's contents in state (accumulator, value, list of records).
    state_type: Any = None


#: What a node runs, by kind: a source or sink, a map/filter/flat_map/reduce
#: callable, a process function, or the spec of an async map, a two-input
#: operator (broadcast state included) or a window; a side output's tag;
#: nothing for a union.
UserFunction = (
    Source
    | Sink
    | ProcessFunction[Any, Any]
    | AsyncSpec
    | CoSpec
    | BroadcastSpec
    | WindowSpec
    | OutputTag[Any]
    | Callable[..., Any]
    | None
)


@dataclass(frozen=True, eq=False)
class Transformation:
    """A node of the job graph (compared by identity: two nodes are never equal).

    ``fn`` is what the node runs; :meth:`payload` reads it as the type its kind holds.
    """

    id: int
    kind: TransformKind
    name: str
    uid: str
    parallelism: int
    inputs: tuple[Transformation, ...] = ()
    fn: UserFunction = None
    partitioning: Partitioning = Partitioning.FORWARD
    key_selector: Callable[[Any], Any] | None = None
    #: ``key_by(..., key_type=)``: the declared type of the keys (None: JSON scalars, tuples).
    key_type: Any = None
    #: Sources only: where event time starts (timestamps and watermarks).
    watermark_strategy: WatermarkStrategy | None = None
    #: ``reduce`` only: the declared type of the value it keeps in state (None: untyped).
    state_type: Any = None

    def payload(self, cls: type[P]) -> P:
        """``fn`` as a ``cls``; a node of another shape is a bug in the graph builder."""
        if not isinstance(self.fn, cls):
            raise JobGraphError(
                f"{self.kind.value} {self.uid!r} runs a {type(self.fn).__name__}, "
                f"not a {cls.__name__}"
            )
        return self.fn

    def source(self) -> Source:
        fn = self.fn
        if not isinstance(fn, Source):
            raise JobGraphError(f"{self.kind.value} {self.uid!r} needs a Source, got {fn!r}")
        return fn

    def sink(self) -> Sink:
        fn = self.fn
        if not isinstance(fn, Sink):
            raise JobGraphError(f"{self.kind.value} {self.uid!r} needs a Sink, got {fn!r}")
        return fn

    def function(self) -> Callable[..., Any]:
        """``fn`` of a map, filter, flat_map or reduce: a plain callable."""
        fn = self.fn
        if not callable(fn):
            raise JobGraphError(f"{self.kind.value} {self.uid!r} needs a callable, got {fn!r}")
        return fn

    def __repr__(self) -> str:
        return f"<{self.kind.value} {self.uid!r} p={self.parallelism}>"


@dataclass(frozen=True)
class JobSpec:
    """Everything the runtime needs to run a job, built by ``StreamEnvironment.spec()``.

    ``params`` are the app's own settings (read-only here: every operator
    instance gets a copy through ``RuntimeContext.params``).
    """

    job_name: str
    transformations: tuple[Transformation, ...]
    config: JobConfig
    params: Mapping[str, Any]
