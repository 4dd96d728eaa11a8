"""Drive one keyed process function by hand (Flink's keyed operator test harness).

The function runs inside the operator the job would run it in
(``key_by(...).process(fn)``), on a real LMDB state backend, so keyed state,
timers, side outputs and snapshots behave as in a job. What the harness does
instead of a task: it hands records in one at a time, advances the watermark
only when told (:meth:`KeyedFunctionHarness.process_watermark`) and moves
processing time on a :class:`~aiostream_ckpt.clock.ManualClock`
(:meth:`KeyedFunctionHarness.set_processing_time`): nothing depends on batch
sizes or wall time.

Records carry no timestamp through this runtime (functions read event time
from the record), so there is no ``timestamp=`` to pass with a record.

Keys are checked and read back as in a job: ``key_type=`` declares them as
``key_by(selector, key_type=...)`` does (an enum, a date, a frozen dataclass,
a tuple of those; pass it again to the harness that restores a snapshot).
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.jobspec.functions import KeyedProcessFunction, OutputTag, RuntimeContext
from aiostream_ckpt.jobspec.state import ListState, MapState, ReducingState, ValueState
from aiostream_ckpt.jobspec.watermarks import MIN_WATERMARK
from aiostream_ckpt.runtime.operators import RecordFailed
from aiostream_ckpt.runtime.timed_process import (
    TimedKeyedProcessOperator,
    make_keyed_process_operator,
)
from aiostream_ckpt.state.backend import SnapshotTarget, StateHandle
from aiostream_ckpt.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from aiostream_ckpt.state.keygroups import KeyGroupRange
from aiostream_ckpt.state.lmdb import LmdbStateBackend
from aiostream_ckpt.time.timers import ProcessingTimeScheduler

IN = TypeVar("IN")
OUT = TypeVar("OUT")
T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

_NO_KEY = object()


@dataclass(frozen=True)
class HarnessSnapshot:
    """A harness's keyed state, timers, watermark and processing time, as a savepoint.

    Self-contained files in a temporary directory that lives as long as this
    object; restore it with ``KeyedFunctionHarness(fn, restore_from=snapshot)``.
    """

    handle: StateHandle
    watermark: int
    processing_time: int
    max_parallelism: int
    _files: tempfile.TemporaryDirectory[str]

    @property
    def root(self) -> Path:
        return Path(self._files.name)


def _discard(coro: Any, name: str) -> None:
    coro.close()  # the harness fires processing-time timers when told, not by sleeping


async def _no_wake() -> None:
    return None


class _KeyedView:
    """A state object read and written as one key's (for assertions).

    It forwards every method of the state's protocol, setting the key first;
    an iterator (a map's ``items()``) is read out under that key at the call.
    """

    def __init__(self, state: Any, harness: KeyedFunctionHarness[Any, Any], key: Any) -> None:
        self._state = state
        self._harness = harness
        self._key = key

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._state, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self._harness._backend.key_context.key = self._key
            result = method(*args, **kwargs)
            if isinstance(result, Iterator):
                result = iter(list(result))  # read under this key, not the next caller's
            return result

        return call


class KeyedFunctionHarness(Generic[IN, OUT]):
    """Runs one :class:`~aiostream_ckpt.jobspec.functions.KeyedProcessFunction` record by record.

    >>> from aiostream_ckpt.jobspec.functions import KeyedProcessFunction
    >>> from aiostream_ckpt.state.descriptors import ValueStateDescriptor
    >>> COUNT = ValueStateDescriptor("count", default=0)
    >>> class CountThenReport(KeyedProcessFunction):
    ...     def open(self, ctx):
    ...         self.count = ctx.get_state(COUNT)
    ...     def process_element(self, value, ctx, out):
    ...         self.count.update(self.count.value() + 1)
    ...         end_of_second = value["ts"] // 1000 * 1000 + 999
    ...         ctx.timer_service().register_event_time_timer(end_of_second)
    ...     def on_timer(self, timestamp, ctx, out):
    ...         out.collect((ctx.current_key, self.count.value()))
    >>> h = KeyedFunctionHarness(CountThenReport(), key_selector=lambda e: e["user"])
    >>> h.process_element({"user": "ann", "ts": 0})
    >>> h.process_element({"user": "ann", "ts": 500})
    >>> h.process_watermark(998)
    >>> h.output(), h.pending_timers()  # one timer: the same (key, time) twice
    ([], (1, 0))
    >>> h.state(COUNT, key="ann").value()
    2
    >>> snap = h.snapshot()
    >>> h.close()
    >>> restored = KeyedFunctionHarness(
    ...     CountThenReport(), key_selector=lambda e: e["user"], restore_from=snap
    ... )
    >>> restored.process_watermark(999)  # the timer came back with the state
    >>> restored.output()
    [('ann', 2)]
    >>> restored.close()
    """

    def __init__(
        self,
        function: KeyedProcessFunction[IN, OUT],
        *,
        key_selector: Callable[[IN], Any] | None = None,
        key_type: Any = None,
        uid: str = "harness",
        params: dict[str, Any] | None = None,
        max_parallelism: int = 128,
        processing_time: int = 0,
        restore_from: HarnessSnapshot | None = None,
    ) -> None:
        if restore_from is not None:
            max_parallelism = restore_from.max_parallelism
            processing_time = restore_from.processing_time
        self._user_selector = key_selector
        self._key: Any = _NO_KEY
        self._local = tempfile.TemporaryDirectory(prefix="aiostream-harness-")
        self._backend = LmdbStateBackend(
            operator_uid=uid,
            subtask_index=0,
            key_group_range=KeyGroupRange(0, max_parallelism - 1),
            max_parallelism=max_parallelism,
            local_dir=Path(self._local.name),
            key_type=key_type,
        )
        self._max_parallelism = max_parallelism
        self.clock = ManualClock(start=processing_time / 1000, wall_offset=0.0)
        self._processing_time = processing_time
        self._operator = make_keyed_process_operator(uid, function, self._select)
        op = self._operator
        op.backend = self._backend
        op.side_output = []
        if isinstance(op, TimedKeyedProcessOperator):
            op.bind_time(ProcessingTimeScheduler(self.clock, _discard, _no_wake, uid))
        if restore_from is not None:
            self._backend.restore(restore_from.root, [restore_from.handle])
        op.open(
            RuntimeContext(
                operator_uid=uid,
                subtask_index=0,
                parallelism=1,
                params=dict(params or {}),
                backend=self._backend,
            )
        )
        self.watermark = MIN_WATERMARK
        if restore_from is not None:
            self.watermark = restore_from.watermark
            op.restore_watermark(self.watermark)
        self._output: list[OUT] = []
        self._side: dict[OutputTag[Any], list[Any]] = {}
        self._snapshot_ids = itertools.count(1)
        self._closed = False

    def _select(self, record: IN) -> Any:
        if self._key is not _NO_KEY:
            return self._key
        assert self._user_selector is not None
        return self._user_selector(record)

    # -- input ------------------------------------------------------------------------

    def process_element(self, value: IN, *, key: Any = _NO_KEY) -> None:
        """Hand ``value`` to the function under ``key`` (default: the key selector's)."""
        if key is _NO_KEY and self._user_selector is None:
            raise TypeError("process_element needs key=... (the harness has no key_selector)")
        self._key = key
        try:
            self._collect(self._operator.process_batch([value]))
        except RecordFailed as exc:
            raise exc.__cause__ or exc from None  # the function's own error, as it raised it
        finally:
            self._key = _NO_KEY

    def process_watermark(self, timestamp: int) -> None:
        """Advance event time to ``timestamp``: fire event-time timers at or before it."""
        if timestamp < self.watermark:
            raise ValueError(
                f"watermark {timestamp} is behind the current one ({self.watermark}): "
                "watermarks never go backwards"
            )
        self.watermark = timestamp
        self._collect(self._operator.process_watermark(timestamp))

    def set_processing_time(self, timestamp: int) -> None:
        """Move the manual clock to ``timestamp`` ms: fire processing-time timers due by then."""
        if timestamp < self._processing_time:
            raise ValueError(
                f"processing time {timestamp} is behind the current one ({self._processing_time})"
            )
        self.clock.advance((timestamp - self._processing_time) / 1000)
        self._processing_time = timestamp
        self._collect(self._operator.process_processing_time(timestamp))

    def _collect(self, records: list[OUT]) -> None:
        self._output.extend(records)
        side = self._operator.side_output
        if side:
            for tag, value in side:
                self._side.setdefault(tag, []).append(value)
            side.clear()

    # -- what came out ----------------------------------------------------------------

    def output(self) -> list[OUT]:
        """Every record the function emitted so far (main output), in order."""
        return list(self._output)

    def side_output(self, tag: OutputTag[Any]) -> list[Any]:
        """Every record the function sent to side output ``tag`` so far."""
        return list(self._side.get(tag, []))

    def clear_output(self) -> None:
        """Forget what was emitted so far (main and side outputs)."""
        self._output.clear()
        self._side.clear()

    # -- state ------------------------------------------------------------------------

    @overload
    def state(self, descriptor: ValueStateDescriptor[T], *, key: Any) -> ValueState[T]: ...
    @overload
    def state(self, descriptor: ListStateDescriptor[T], *, key: Any) -> ListState[T]: ...
    @overload
    def state(self, descriptor: MapStateDescriptor[K, V], *, key: Any) -> MapState[K, V]: ...
    @overload
    def state(self, descriptor: ReducingStateDescriptor[T], *, key: Any) -> ReducingState[T]: ...
    def state(self, descriptor: StateDescriptor, *, key: Any) -> Any:
        """Return state ``descriptor`` as the function sees it under ``key`` (read or set it).

        Typed by the descriptor, as ``ctx.get_state`` is: a ``ValueStateDescriptor("n",
        int, default=0)`` gives a ``ValueState[int]``.
        """
        return _KeyedView(self._backend.create_state(descriptor), self, key)

    def keys(self, state_name: str) -> list[Any]:
        """Keys that have a value in state ``state_name``."""
        return list(self._backend.keys(state_name))

    def pending_timers(self) -> tuple[int, int]:
        """How many (event-time, processing-time) timers are set."""
        op = self._operator
        if not isinstance(op, TimedKeyedProcessOperator) or op.timer_service is None:
            return 0, 0
        return op.timer_service.pending()

    # -- snapshot / restore -----------------------------------------------------------

    def snapshot(self) -> HarnessSnapshot:
        """Take a self-contained snapshot (keyed state, timers, watermark, clock)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.snapshot_async())
        raise RuntimeError("snapshot() inside a running event loop: await snapshot_async()")

    async def snapshot_async(self) -> HarnessSnapshot:
        """:meth:`snapshot` on the running event loop (from async tests)."""
        files = tempfile.TemporaryDirectory(prefix="aiostream-harness-snapshot-")
        root = Path(files.name)
        sid = next(self._snapshot_ids)
        self._operator.prepare_snapshot_pre_barrier(sid)
        part = self._backend.snapshot(
            SnapshotTarget(sid, root, root / f"savepoint-{sid}", root, is_savepoint=True)
        )
        await part.prepare()
        handle = part.write()
        await part.settle()
        return HarnessSnapshot(
            handle, self.watermark, self._processing_time, self._max_parallelism, files
        )

    def close(self) -> None:
        """Close the function and the state backend; remove the harness's files."""
        if self._closed:
            return
        self._closed = True
        try:
            self._operator.close()
        finally:
            self._backend.close()
            self._local.cleanup()
