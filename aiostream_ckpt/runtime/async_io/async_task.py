"""The task that runs a chain headed by an :class:`AsyncWaitOperator` (``map_async``).

A plain task does one thing at a time: take an element, push it through the
chain, emit. Here results arrive between input elements, so the loop waits on
*either* the input gate *or* a completion of the operator, and only this loop
emits (results, watermarks and barriers never race each other). The chain
after the async operator runs on results as the rest of a chain runs on input.

- A batch goes into the operator; while part of it waits for room the loop
  reads no further input (backpressure), it only waits for completions.
- A watermark is queued in the operator behind the records before it and
  forwarded when it leaves (it never overtakes a result, in either order mode).
- At a barrier the ready results go out first, then the snapshot takes the
  records still in flight as operator state, and the calls go on. An
  unaligned barrier is taken even while the operator is full (its records
  waiting for room are operator state too).
- At the end of input every call is awaited and emitted before end-of-input.

The async operator is never chained to its input (``runtime.graph``), so it is
always the head of an input task's chain; the plain task's hot path is untouched.

Before it waits, the loop reads the clock (``loop.time()``). uvloop (libuv)
computes how long to poll from the time it cached when the iteration began,
so without a fresh reading every timer due meanwhile (a call's
``asyncio.sleep``, a retry's delay) fired late by as long as the chain had
just worked: measured 11.1 / 13.1 / 16.1 ms for a 10 ms timer after 1 / 3 /
6 ms of work (plain asyncio: 10.2 ms in each case).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier
from aiostream_ckpt.jobspec.functions import RuntimeContext
from aiostream_ckpt.runtime.async_io.async_wait import AsyncCallError, AsyncWaitOperator
from aiostream_ckpt.runtime.chain import ChainSpec, TaskState
from aiostream_ckpt.runtime.elements import Watermark
from aiostream_ckpt.runtime.task import StreamTask


def is_async_chain(spec: ChainSpec) -> bool:
    return bool(spec.operators) and isinstance(spec.operators[0], AsyncWaitOperator)


class AsyncWaitTask(StreamTask):
    """A :class:`StreamTask` whose loop also waits on the async operator's completions."""

    def __init__(self, spec: ChainSpec, **kw: Any) -> None:
        super().__init__(spec, **kw)
        op = spec.operators[0]
        assert isinstance(op, AsyncWaitOperator) and spec.input_gate is not None
        self._async = op
        self._started_seen = 0  # op.calls_started when this loop last yielded for them

    async def restore_state(self) -> None:
        await super().restore_state()
        spec = self.spec
        await self._async.start(
            RuntimeContext(
                operator_uid=self._async.uid,
                subtask_index=spec.subtask,
                parallelism=spec.parallelism,
                params=self._params,
                backend=self._async.backend,
            ),
            self._clock,
        )

    def _time_uids(self) -> list[str | None]:
        # the operator's own entry carries the task's event time when nothing keyed follows
        return [*super()._time_uids(), self._async.uid]

    async def close(self) -> None:
        try:
            await self._async.stop()
        finally:
            await super().close()

    async def _run_input(self) -> None:
        gate = self.spec.input_gate
        handler = self.spec.barrier_handler
        assert gate is not None and handler is not None
        op = self._async
        queue = gate.queue
        replay = self._replay
        metrics = self.metrics
        get: asyncio.Future[tuple[int, Any]] | None = None
        done_wait: asyncio.Future[Any] | None = None
        fresh_time = asyncio.get_running_loop().time  # reading it refreshes uvloop's cache
        await self._time.announce()
        try:
            while not self._done.is_set():
                await self._emit_ready()
                if op.blocked:  # records wait for room (a batch, restored ones): read nothing else
                    op.admit()
                    if not op.blocked:
                        continue
                    if not queue.has_priority:  # ... but an unaligned barrier overtakes them
                        fresh_time()  # uvloop polls from this time: see the module docstring
                        arrival = queue.priority_arrival()
                        await asyncio.wait(
                            {op.wakeup(), arrival}, return_when=asyncio.FIRST_COMPLETED
                        )
                        arrival.cancel()
                        continue
                    channel, element = queue.get_nowait()
                elif replay:
                    channel, element = self._take_replay()
                elif get is None and not queue.empty():
                    # taken at once: a get task takes loop iterations while the room waits
                    channel, element = queue.get_nowait()
                else:
                    if get is None:
                        get = asyncio.ensure_future(queue.get())
                    if not get.done():
                        waits: set[asyncio.Future[Any]] = {get, op.wakeup()}
                        if self.state is TaskState.ENDED:
                            if done_wait is None:
                                done_wait = asyncio.ensure_future(self._done.wait())
                            waits.add(done_wait)
                        fresh_time()  # uvloop polls from this time: see the module docstring
                        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                        if not get.done():
                            continue
                    channel, element = get.result()
                    get = None
                if handler.holding and handler.is_held(channel) and handler.hold(channel, element):
                    continue
                if type(element) is list:
                    metrics.records_in += len(element)
                    metrics.batches_in += 1
                    op.offer(element)
                else:
                    await self._on_control(channel, element)
        finally:
            for fut in (get, done_wait):
                if fut is not None:
                    fut.cancel()
                    await asyncio.gather(fut, return_exceptions=True)

    async def _emit_ready(self) -> None:
        """Send what the operator lets go of now through the rest of the chain.

        Popping frees room, and the operator starts the next calls at once; a
        task's first step runs only when this loop yields, so it yields once
        before the chain runs on the results: the calls' waits overlap with
        that work instead of starting after it. Without it a full round of
        ``capacity`` calls took ``latency + capacity x CPU per record`` (12.3 k
        rec/s for 10 ms, capacity 200, 28 us a record: 0.77 x the target).
        """
        op = self._async
        ready = op.pop_ready()
        if op.calls_started != self._started_seen:  # calls started here or since input came
            await asyncio.sleep(0)
            self._started_seen = op.calls_started
        for item in ready:
            if type(item) is list:
                op.records_out += len(item)
                await self._chain.push_tail(item)
            elif isinstance(item, Watermark):
                await super()._advance_watermark(item.timestamp)
            else:
                assert isinstance(item, AsyncCallError)
                if self._chain.process_errors is None:  # errors.on_process_error=fail
                    raise item  # the job fails, naming the operator and the record
                # dead_letter: the record and the call's traceback (a timeout: its own error)
                self._chain.process_errors.dead_letter(
                    self._async.uid, item.record, item.__cause__ or item
                )

    async def _advance_watermark(self, timestamp: int) -> None:
        op = self._async
        if op.idle:
            await super()._advance_watermark(timestamp)
        else:
            op.add_watermark(Watermark(timestamp))

    async def _checkpoint(self, barrier: CheckpointBarrier, alignment_seconds: float) -> None:
        # results already back go out before the barrier: fewer calls to repeat after a restore
        await self._emit_ready()
        await super()._checkpoint(barrier, alignment_seconds)

    async def _end_input(self) -> None:
        op = self._async
        while not op.idle:
            asyncio.get_running_loop().time()  # uvloop polls from this time (module docstring)
            await op.wakeup()
            await self._emit_ready()
        await super()._end_input()
