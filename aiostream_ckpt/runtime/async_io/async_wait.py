"""The async wait operator behind ``map_async``: calls in flight, their order, their snapshot.

Each admitted record becomes an *entry*: its call runs as an asyncio task the
operator owns, and the entry stays in the operator's queue until its result
is emitted. At most ``capacity`` entries exist at once; a batch that does not
fit waits in ``_pending`` and the task reads no further input meanwhile, so
backpressure reaches the source through the bounded channels.

Order (Flink's ordered/unordered stream element queues):

- ordered: one FIFO of entries and watermarks; the head leaves once done;
- unordered: segments closed by watermarks; a segment's done entries leave
  in completion order, its watermark once the segment is empty, and nothing
  of a later segment leaves before that watermark.

The task drives this (``runtime.async_io.async_task``): it admits, waits on input
*or* a completion, emits what :meth:`AsyncWaitOperator.pop_ready` hands out.
At a barrier, every entry not yet emitted is written into operator state as
its input record (see :mod:`aiostream_ckpt.jobspec.async_functions`).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import pickle
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.clock import Clock, SystemClock
from aiostream_ckpt.errors import RecordError, StateError
from aiostream_ckpt.jobspec.async_functions import AsyncSpec
from aiostream_ckpt.jobspec.functions import RuntimeContext
from aiostream_ckpt.runtime.elements import Watermark
from aiostream_ckpt.runtime.operators import StreamOperator
from aiostream_ckpt.state.keygroups import KeyGroupRange, key_group_for, serialize_key
from aiostream_ckpt.user_errors import user_traceback

log = logging.getLogger(__name__)

IN_FLIGHT_KEY = "in_flight"


class AsyncCallError(RecordError):
    """An async call failed for good (it raised, or timed out) for one record."""

    def __init__(self, message: str, record: Any, *, detail: str | None = None) -> None:
        super().__init__(message, detail=detail)
        self.record = record


class _Entry:
    __slots__ = (
        "done",
        "error",
        "key",
        "record",
        "result",
        "segment",
        "task",
        "timed_out",
        "writes",
    )

    def __init__(self, record: Any) -> None:
        self.record = record
        #: keyed variant (``async_io.async_keyed``): the record's key, its buffered state writes
        self.key: Any = None
        self.writes: dict[str, Any] | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.timed_out = False
        self.segment: _Segment | None = None
        self.task: asyncio.Task[None] | None = None


class _Segment:
    """Unordered mode: entries between two watermarks, and the watermark closing them."""

    __slots__ = ("done", "open", "watermark")

    def __init__(self) -> None:
        self.open: dict[_Entry, None] = {}  # insertion-ordered set
        self.done: list[_Entry] = []
        self.watermark: Watermark | None = None


class _OrderedQueue:
    def __init__(self) -> None:
        self._items: deque[_Entry | Watermark] = deque()

    def push(self, entry: _Entry) -> None:
        self._items.append(entry)

    def push_watermark(self, wm: Watermark) -> None:
        self._items.append(wm)

    def on_done(self, entry: _Entry) -> None:
        return None

    def pop_ready(self) -> list[_Entry | Watermark]:
        items = self._items
        out: list[_Entry | Watermark] = []
        while items:
            head = items[0]
            if type(head) is _Entry and not head.done:
                break
            out.append(items.popleft())
        return out

    def entries(self) -> Iterator[_Entry]:
        return (e for e in self._items if type(e) is _Entry)

    def __len__(self) -> int:
        return len(self._items)


class _UnorderedQueue:
    def __init__(self) -> None:
        self._segments: deque[_Segment] = deque([_Segment()])

    def push(self, entry: _Entry) -> None:
        last = self._segments[-1]
        if last.watermark is not None:
            last = _Segment()
            self._segments.append(last)
        entry.segment = last
        last.open[entry] = None

    def push_watermark(self, wm: Watermark) -> None:
        last = self._segments[-1]
        if last.watermark is not None:
            last = _Segment()
            self._segments.append(last)
        last.watermark = wm

    def on_done(self, entry: _Entry) -> None:
        seg = entry.segment
        assert seg is not None
        del seg.open[entry]
        seg.done.append(entry)

    def pop_ready(self) -> list[_Entry | Watermark]:
        out: list[_Entry | Watermark] = []
        segments = self._segments
        while True:
            seg = segments[0]
            if seg.done:
                out.extend(seg.done)
                seg.done = []
            if seg.open or seg.watermark is None:
                return out
            out.append(seg.watermark)
            segments.popleft()
            if not segments:
                segments.append(_Segment())

    def entries(self) -> Iterator[_Entry]:
        for seg in self._segments:
            yield from seg.done
            yield from seg.open

    def __len__(self) -> int:
        return sum(len(s.open) + len(s.done) + (s.watermark is not None) for s in self._segments)


class AsyncWaitOperator(StreamOperator):
    """Up to ``capacity`` calls of an async function in flight; see the module docstring."""

    def __init__(
        self, uid: str, spec: AsyncSpec, key_selector: Callable[[Any], Any] | None = None
    ) -> None:
        super().__init__(uid)
        self.spec = spec
        self._fn = spec.function
        self._capacity = spec.capacity
        self._timeout = spec.timeout
        self._retry = spec.retry
        self._key_selector = key_selector
        self._queue: _OrderedQueue | _UnorderedQueue = (
            _OrderedQueue() if spec.ordered else _UnorderedQueue()
        )
        self._pending: deque[Any] = deque()
        self._size = 0  # entries admitted and not yet emitted
        # (deadline, entry) in admission order, so deadlines ascend: one timer
        # for the earliest replaces a timeout context per call (~11 us a record)
        self._deadlines: deque[tuple[float, _Entry]] = deque()
        self._expiry: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Future[None] | None = None
        self._ready = False
        self._clock: Clock = SystemClock()
        self._opened = False
        #: calls started (re-issued ones included), for metrics and tests
        self.calls_started = 0

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self, ctx: RuntimeContext, clock: Clock) -> None:
        """Open the user function (after state was restored); idempotent."""
        if self._opened:
            return
        self._clock = clock
        await self._fn.open(ctx)
        self._opened = True

    async def stop(self) -> None:
        """Cancel the calls in flight, await them, then close the user function."""
        expiry, self._expiry = self._expiry, None
        tasks = [e.task for e in self._queue.entries() if e.task is not None and not e.done]
        if expiry is not None:
            tasks.append(expiry)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._opened:
            self._opened = False
            await self._fn.close()

    def process_batch(self, batch: list[Any]) -> list[Any]:
        raise TypeError(f"operator {self.uid!r}: an async operator is driven by its task")

    # -- input --------------------------------------------------------------------------

    def offer(self, batch: list[Any]) -> None:
        """Take ``batch``; :meth:`admit` starts as many of its calls as there is room for."""
        self._pending.extend(batch)
        self.admit()

    def admit(self) -> None:
        pending = self._pending
        if not pending:
            return
        queue = self._queue
        loop = asyncio.get_running_loop()
        deadline = self._deadline()
        while pending and self._size < self._capacity:
            entry = _Entry(pending.popleft())
            queue.push(entry)
            self._size += 1
            if self._admitted(entry):
                self._start(entry, loop, deadline)
        self._arm_expiry(loop)

    def _arm_expiry(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._deadlines and self._expiry is None:
            self._expiry = loop.create_task(self._expire(), name=f"{self.uid}-timeouts")

    def _admitted(self, entry: _Entry) -> bool:
        """Whether ``entry``'s call starts now (the keyed variant may hold it back)."""
        return True

    def _deadline(self) -> float:
        return self._clock.monotonic() + self._timeout if self._timeout is not None else 0.0

    def _start(self, entry: _Entry, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """Start ``entry``'s call; it times out at ``deadline`` (deadlines must ascend)."""
        self.calls_started += 1
        entry.task = loop.create_task(self._call(entry))
        if self._timeout is not None:
            deadlines = self._deadlines
            # finished calls leave now, not when the timer next fires: else every
            # entry (its record and result) stayed alive for `timeout` seconds
            while deadlines and deadlines[0][1].done:
                deadlines.popleft()
            deadlines.append((deadline, entry))

    async def _expire(self) -> None:
        """Cancel the calls past their deadline; they fail with a timeout (see ``_call``).

        One task sleeps on the injected clock until the earliest deadline, so a
        test moves a :class:`~aiostream_ckpt.clock.ManualClock` past a timeout
        instead of waiting for it. It ends once no deadline is left.
        """
        clock = self._clock
        deadlines = self._deadlines
        while deadlines:
            now = clock.monotonic()
            while deadlines and (deadlines[0][1].done or deadlines[0][0] <= now):
                _, entry = deadlines.popleft()
                if not entry.done and entry.task is not None:
                    entry.timed_out = True
                    entry.task.cancel()
            if deadlines:
                await clock.sleep(deadlines[0][0] - now)
        self._expiry = None

    @property
    def blocked(self) -> bool:
        """Records wait for room: the task must not read on."""
        return bool(self._pending)

    @property
    def idle(self) -> bool:
        """Nothing in flight, nothing waiting, nothing to emit."""
        return not self._pending and not len(self._queue)

    @property
    def in_flight(self) -> int:
        return self._size

    def add_watermark(self, wm: Watermark) -> None:
        """Queue ``wm`` behind the entries before it (the task forwards it when it leaves)."""
        self._queue.push_watermark(wm)
        self._signal()

    # -- calls --------------------------------------------------------------------------

    async def _call(self, entry: _Entry) -> None:
        try:
            if self._retry is None:  # one coroutine less a call
                entry.result = await self._fn.invoke(entry.record)
            else:
                entry.result = await self._attempts(entry.record)
        except asyncio.CancelledError:
            if not entry.timed_out:
                raise  # stop(): the task is closing
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # the cancellation was our timeout, it is handled here
            entry.error = TimeoutError(f"no result within {self._timeout} s")
        except Exception as exc:  # handed to the error policy when the entry is emitted
            entry.error = exc
        entry.done = True
        self._queue.on_done(entry)
        self._signal()

    async def _attempts(self, record: Any) -> Any:
        retry = self._retry
        attempt = 1
        while True:
            try:
                return await self._fn.invoke(record)
            except Exception as exc:
                if retry is None or attempt >= retry.attempts or not isinstance(exc, retry.on):
                    raise
                attempt += 1
                log.debug("operator %s: retry %d after %r", self.uid, attempt, exc)
                await self._clock.sleep(retry.delay_before(attempt))

    def _signal(self) -> None:
        self._ready = True
        fut = self._wakeup
        if fut is not None and not fut.done():
            fut.set_result(None)

    def wakeup(self) -> asyncio.Future[None]:
        """Return a future that is done once something may be ready to emit."""
        fut = self._wakeup
        if fut is None or fut.done():
            fut = self._wakeup = asyncio.get_running_loop().create_future()
            if self._ready:
                fut.set_result(None)
        return fut

    # -- output -------------------------------------------------------------------------

    def pop_ready(self) -> list[list[Any] | Watermark | AsyncCallError]:
        """Return what may leave now, in emission order: record batches, watermarks, failures.

        A failed call (it raised, or timed out) comes out in its turn as an
        :class:`AsyncCallError` naming the operator and the record; the task
        applies the error policy to it.
        """
        if not self._ready:
            return []
        self._ready = False
        items = self._queue.pop_ready()
        if not items:
            return []
        out: list[list[Any] | Watermark | AsyncCallError] = []
        batch: list[Any] = []
        for item in items:
            if type(item) is _Entry:
                self._size -= 1
                self._emitted(item)
                if item.error is None:
                    batch.append(item.result)
                    continue
            if batch:
                out.append(batch)
                batch = []
            out.append(self._failure(item) if isinstance(item, _Entry) else item)
        if batch:
            out.append(batch)
        self.admit()
        return out

    def _emitted(self, entry: _Entry) -> None:
        """``entry`` leaves the operator (its result, or its failure, goes out now)."""

    def _failure(self, entry: _Entry) -> AsyncCallError:
        exc = entry.error
        what = f"timed out after {self._timeout} s" if entry.timed_out else f"raised {exc!r}"
        err = AsyncCallError(
            f"operator {self.uid!r}: async call {what} for record {entry.record!r:.200}",
            entry.record,
            detail=user_traceback(exc) if exc is not None and not entry.timed_out else None,
        )
        err.__cause__ = exc
        return err

    # -- snapshot and restore -----------------------------------------------------------

    def snapshot_state(self) -> dict[str, Any] | None:
        """Store the input records of every entry not yet emitted (or not yet admitted)."""
        records = [e.record for e in self._queue.entries()]
        records.extend(self._pending)
        return {IN_FLIGHT_KEY: [self._encode(r) for r in records]}

    def restore_state(self, restored: CompletedCheckpoint, subtask: int, parallelism: int) -> None:
        """Re-issue the restored records before any new input.

        At another parallelism, keyed streams take the records of their key
        groups; others take old subtask ``j``'s records when ``j % parallelism``
        is their index.
        """
        old = restored.subtask_states(self.uid)
        keyed = self._key_selector is not None
        if keyed:
            maxp = restored.max_parallelism
            groups = KeyGroupRange.for_operator(subtask, parallelism, maxp)
        for j in sorted(old):
            if not keyed and j % parallelism != subtask:
                continue
            for raw in (old[j].get("operator") or {}).get(IN_FLIGHT_KEY, ()):
                record = self._decode(raw)
                if keyed:
                    assert self._key_selector is not None
                    kg = key_group_for(serialize_key(self._key_selector(record)), maxp)
                    if kg not in groups:
                        continue
                self._pending.append(record)

    def _encode(self, record: Any) -> str:
        try:
            if self.spec.serializer == "json":
                return orjson.dumps(record).decode()
            return base64.b64encode(pickle.dumps(record, protocol=5)).decode("ascii")
        except (TypeError, pickle.PicklingError) as exc:
            raise StateError(
                f"operator {self.uid!r}: a record in flight cannot go into the checkpoint "
                f"with serializer={self.spec.serializer!r} ({exc}); records must be "
                "JSON-able, or pass serializer='pickle' to map_async"
            ) from exc

    def _decode(self, raw: str) -> Any:
        if self.spec.serializer == "json":
            return orjson.loads(raw)
        return pickle.loads(base64.b64decode(raw))
