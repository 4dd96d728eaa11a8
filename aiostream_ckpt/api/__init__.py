"""The public API: build jobs on a :class:`StreamEnvironment`."""

from aiostream_ckpt.api.async_functions import AsyncFunction, AsyncRetry, KeyedAsyncFunction
from aiostream_ckpt.api.broadcast import (
    BroadcastProcessFunction,
    BroadcastStream,
    KeyedBroadcastProcessFunction,
)
from aiostream_ckpt.api.co_functions import CoProcessFunction, KeyedCoProcessFunction
from aiostream_ckpt.api.environment import StreamEnvironment
from aiostream_ckpt.api.functions import (
    Collector,
    Context,
    KeyedProcessFunction,
    ProcessFunction,
    RuntimeContext,
)
from aiostream_ckpt.api.stream import KeyedStream, Stream
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
    "Context",
    "KeyedAsyncFunction",
    "KeyedBroadcastProcessFunction",
    "KeyedCoProcessFunction",
    "KeyedProcessFunction",
    "KeyedStream",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ProcessFunction",
    "ReducingStateDescriptor",
    "RuntimeContext",
    "StateTtlConfig",
    "Stream",
    "StreamEnvironment",
    "TtlUpdateType",
    "ValueStateDescriptor",
]
