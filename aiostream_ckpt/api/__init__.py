"""The public API: build jobs on a :class:`StreamEnvironment`."""

from aiostream_ckpt.api.broadcast import BroadcastStream
from aiostream_ckpt.api.connected import ConnectedStreams
from aiostream_ckpt.api.environment import StreamEnvironment
from aiostream_ckpt.api.stream import KeyedStream, Stream
from aiostream_ckpt.api.windowed_stream import WindowedStream
from aiostream_ckpt.jobspec.async_functions import AsyncFunction, AsyncRetry, KeyedAsyncFunction
from aiostream_ckpt.jobspec.broadcast import (
    BroadcastProcessFunction,
    KeyedBroadcastProcessFunction,
)
from aiostream_ckpt.jobspec.co_functions import CoProcessFunction, KeyedCoProcessFunction
from aiostream_ckpt.jobspec.functions import (
    Collector,
    Context,
    KeyedProcessFunction,
    OutputTag,
    ProcessFunction,
    RuntimeContext,
)
from aiostream_ckpt.jobspec.state import ListState, MapState, ReducingState, ValueState
from aiostream_ckpt.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    TtlUpdateType,
    ValueStateDescriptor,
)

__all__ = [
    "AsyncFunction",
    "AsyncRetry",
    "BroadcastProcessFunction",
    "BroadcastStream",
    "CoProcessFunction",
    "Collector",
    "ConnectedStreams",
    "Context",
    "KeyedAsyncFunction",
    "KeyedBroadcastProcessFunction",
    "KeyedCoProcessFunction",
    "KeyedProcessFunction",
    "KeyedStream",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "OutputTag",
    "ProcessFunction",
    "ReducingState",
    "ReducingStateDescriptor",
    "RuntimeContext",
    "StateTtlConfig",
    "Stream",
    "StreamEnvironment",
    "TtlUpdateType",
    "ValueState",
    "ValueStateDescriptor",
    "WindowedStream",
]
