"""``key_by(...).map_async(KeyedAsyncFunction)``: async calls with keyed state.

Why the state is buffered: a call's result is emitted, and its record leaves
the checkpoint's in-flight set, only when the operator lets it go. A call that
wrote keyed state directly and was still in flight at a barrier would have its
write in the snapshot *and* its record re-issued after a restore: the write
would happen twice. So each call writes into its own buffer, and the buffer is
applied to keyed state when its result is emitted (a failed call's is dropped):
the snapshot holds exactly the writes of the emitted results.

Why one call per key: a call reads the state its key's previous call left, so
the next call of a key starts only once the previous one was emitted; calls of
different keys run side by side up to ``capacity``. The call's entry is taken
from a context variable (each asyncio task has its own copy), so a state read
in the middle of ``invoke`` sees the right key whatever other calls run
meanwhile.
"""

from __future__ import annotations

import asyncio
from collections import deque
from contextvars import ContextVar
from typing import Any

from aiostream_ckpt.errors import StateError
from aiostream_ckpt.jobspec.async_functions import AsyncFunction, AsyncSpec, KeyedAsyncFunction
from aiostream_ckpt.jobspec.functions import RuntimeContext
from aiostream_ckpt.runtime.async_io.async_state import BufferedState, buffered_state
from aiostream_ckpt.runtime.async_io.async_wait import AsyncWaitOperator, _Entry
from aiostream_ckpt.state.descriptors import StateDescriptor

_CALL: ContextVar[_Entry | None] = ContextVar("aiostream_ckpt_async_call", default=None)


class _KeyedAsyncContext(RuntimeContext):
    """The ``open`` context of a :class:`KeyedAsyncFunction`: hands out buffered states."""

    def __init__(self, ctx: RuntimeContext, op: KeyedAsyncWaitOperator) -> None:
        super().__init__(
            operator_uid=ctx.operator_uid,
            subtask_index=ctx.subtask_index,
            parallelism=ctx.parallelism,
            params=ctx.params,
            backend=None,
        )
        self._op = op

    def get_state(self, descriptor: StateDescriptor) -> Any:
        return self._op.buffered_state(descriptor)


class _PerAttempt(AsyncFunction[Any, Any]):
    """Each attempt (retries) starts with no buffered writes: a failed one's are dropped."""

    def __init__(self, fn: AsyncFunction[Any, Any]) -> None:
        self.fn = fn

    async def open(self, ctx: RuntimeContext) -> None:
        await self.fn.open(ctx)

    async def invoke(self, value: Any) -> Any:
        entry = _CALL.get()
        assert entry is not None
        entry.writes = None
        return await self.fn.invoke(value)

    async def close(self) -> None:
        await self.fn.close()


class KeyedAsyncWaitOperator(AsyncWaitOperator):
    """:class:`AsyncWaitOperator` with keyed state; see the module docstring."""

    keyed = True

    def __init__(self, uid: str, spec: AsyncSpec, key_selector: Any) -> None:
        super().__init__(uid, spec, key_selector)
        self._fn = _PerAttempt(spec.function)
        self._ks = key_selector
        #: key -> entries of that key admitted but not started (present: a call of it is out)
        self._busy: dict[Any, deque[_Entry]] = {}
        self._states: dict[str, BufferedState[Any]] = {}

    async def start(self, ctx: RuntimeContext, clock: Any) -> None:
        await super().start(_KeyedAsyncContext(ctx, self), clock)

    def keyed_state(self, descriptor: StateDescriptor) -> Any:
        assert self.backend is not None
        return self.backend.create_state(descriptor)

    def buffered_state(self, descriptor: StateDescriptor) -> BufferedState[Any]:
        state = self._states.get(descriptor.name)
        if state is None:
            state = self._states[descriptor.name] = buffered_state(self, descriptor)
        return state

    def current_call(self, name: str) -> _Entry:
        entry = _CALL.get()
        if entry is None:
            raise StateError(
                f"state {name!r} of a KeyedAsyncFunction is read and written inside "
                "invoke() only (it belongs to the key of the record being handled)"
            )
        return entry

    def set_key(self, key: Any) -> None:
        assert self.backend is not None
        self.backend.key_context.key = key

    def _admitted(self, entry: _Entry) -> bool:
        entry.key = key = self._ks(entry.record)
        waiting = self._busy.get(key)
        if waiting is None:
            self._busy[key] = deque()
            return True
        waiting.append(entry)
        return False

    async def _call(self, entry: _Entry) -> None:
        _CALL.set(entry)  # this task's own context: the states find the call's key here
        await super()._call(entry)

    def _emitted(self, entry: _Entry) -> None:
        writes = entry.writes
        if writes and entry.error is None:
            self.set_key(entry.key)
            for name, buf in writes.items():
                self._states[name].apply(buf)
        waiting = self._busy[entry.key]
        if waiting:
            loop = asyncio.get_running_loop()
            self._start(waiting.popleft(), loop, self._deadline())
            self._arm_expiry(loop)
        else:
            del self._busy[entry.key]


def make_async_operator(uid: str, spec: AsyncSpec, key_selector: Any) -> AsyncWaitOperator:
    """Build the keyed-state variant for a :class:`KeyedAsyncFunction`, else the plain one."""
    if isinstance(spec.function, KeyedAsyncFunction):
        return KeyedAsyncWaitOperator(uid, spec, key_selector)
    return AsyncWaitOperator(uid, spec, key_selector)
