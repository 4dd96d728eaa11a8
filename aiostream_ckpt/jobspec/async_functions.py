"""Async I/O: user functions that ``await`` (HTTP lookups, database reads) inside a job.

``stream.map_async(fn, capacity=N)`` keeps up to ``N`` calls of ``fn`` in
flight per subtask, so a 10 ms lookup does not cost 10 ms per record.

Snapshot/restore contract (Flink's ``AsyncWaitOperator``): at a barrier the
records whose calls have not been emitted yet are written into the checkpoint
as operator state, the calls themselves are *not* waited for (alignment stays
short) and go on. After a restore those records are issued again, before any
newer input. The function may therefore see a record twice (requests repeat),
while its result is emitted into the committed output exactly once. Calls
should be idempotent reads or idempotent writes; nothing the function keeps in
attributes is checkpointed.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from aiostream_ckpt.jobspec.functions import RuntimeContext

IN = TypeVar("IN")
OUT = TypeVar("OUT")


class AsyncFunction(Generic[IN, OUT]):
    """An async function with a lifecycle (e.g. one HTTP session per subtask).

    >>> import asyncio
    >>> class Double(AsyncFunction):
    ...     async def invoke(self, value):
    ...         await asyncio.sleep(0)
    ...         return value * 2
    >>> from aiostream_ckpt.api.environment import StreamEnvironment
    >>> env = StreamEnvironment("doc")
    >>> s = env.from_collection([1, 2, 3]).map_async(Double(), capacity=2, uid="double")
    >>> env.execute_and_collect(s)
    [2, 4, 6]
    """

    async def open(self, ctx: RuntimeContext) -> None:
        """Prepare the instance (open sessions) before its first call."""

    async def invoke(self, value: IN) -> OUT:
        """Return the result for ``value``; raising sends it to the error policy."""
        raise TypeError(f"{type(self).__name__} must override invoke")

    async def close(self) -> None:
        """Release resources; called after the calls still in flight were cancelled."""


class KeyedAsyncFunction(AsyncFunction[IN, OUT]):
    """An async function on a keyed stream with keyed state, one call per key at a time.

    ``key_by(f).map_async(fn)``: value, list, map and reducing states from
    ``ctx.get_state(...)`` in :meth:`open` are read and written inside
    :meth:`invoke` for the key of the record being handled. A call's writes
    take effect when its result is emitted (a failed call's never do), so they
    are exactly-once like the result; the next record of a key is issued once
    the previous one was emitted, so it sees those writes (records of other
    keys go on meanwhile).

    >>> import asyncio
    >>> from aiostream_ckpt.api.environment import StreamEnvironment
    >>> from aiostream_ckpt.state.descriptors import ValueStateDescriptor
    >>> class NumberPerKey(KeyedAsyncFunction):
    ...     async def open(self, ctx):
    ...         self.seen = ctx.get_state(ValueStateDescriptor("seen", int, default=0))
    ...     async def invoke(self, value):
    ...         await asyncio.sleep(0.001)  # a lookup
    ...         n = self.seen.value() + 1
    ...         self.seen.update(n)
    ...         return (value, n)
    >>> env = StreamEnvironment("doc")
    >>> s = env.from_collection(["a", "b", "a", "a"]).key_by(lambda v: v)
    >>> env.execute_and_collect(s.map_async(NumberPerKey(), capacity=4, uid="n"))
    [('a', 1), ('b', 1), ('a', 2), ('a', 3)]
    """


class _Wrapped(AsyncFunction[Any, Any]):
    """A plain ``async def`` as an :class:`AsyncFunction`."""

    def __init__(self, fn: Callable[[Any], Awaitable[Any]]) -> None:
        self._fn = fn

    async def invoke(self, value: Any) -> Any:
        return await self._fn(value)


def as_async_function(fn: Any) -> AsyncFunction[Any, Any]:
    """Accept an :class:`AsyncFunction` or an ``async def``; reject a blocking function."""
    if isinstance(fn, AsyncFunction):
        return fn
    if not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)):
        raise TypeError(
            f"map_async needs an 'async def' function or an AsyncFunction, got {fn!r}; "
            "use map() for a synchronous function"
        )
    return _Wrapped(fn)


@dataclass(frozen=True)
class AsyncRetry:
    """Retry failed calls: ``attempts`` in all, ``delay * backoff**(n-2)`` s before attempt n.

    Only exceptions of the types in ``on`` are retried. A ``timeout`` of
    ``map_async`` bounds all attempts of a record together (as Flink's does).

    >>> AsyncRetry(attempts=4, delay=0.1, backoff=2.0).delay_before(3)
    0.2
    """

    attempts: int = 3
    delay: float = 0.05
    backoff: float = 2.0
    max_delay: float = 5.0
    on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"AsyncRetry.attempts must be >= 1, got {self.attempts}")
        if self.delay < 0 or self.backoff < 1 or self.max_delay < 0:
            raise ValueError("AsyncRetry: delay and max_delay >= 0, backoff >= 1")

    def delay_before(self, attempt: int) -> float:
        """Seconds to wait before attempt number ``attempt`` (2 is the first retry)."""
        return float(min(self.max_delay, self.delay * self.backoff ** max(0, attempt - 2)))


@dataclass(frozen=True)
class AsyncSpec:
    """What ``map_async`` asked for; the job graph builds the operator from it."""

    function: AsyncFunction[Any, Any]
    capacity: int
    timeout: float | None
    ordered: bool
    retry: AsyncRetry | None
    serializer: str

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"map_async: capacity must be >= 1, got {self.capacity}")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"map_async: timeout must be > 0 seconds, got {self.timeout}")
        if self.serializer not in ("json", "pickle"):
            raise ValueError(
                f"map_async: serializer is 'json' or 'pickle', not {self.serializer!r}"
            )
