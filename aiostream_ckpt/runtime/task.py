"""A task: one parallel instance of a chain of operators, run as one asyncio task.

A chain is headed by a source reader or fed by an input gate, runs its
operators batch by batch, and ends in output gates or a sink writer. The task
owns the checkpoint protocol for its chain:

- at barrier n (aligned when there are several inputs): take the synchronous
  snapshot of every operator (source position, keyed state, sink pre-commit),
  forward the barrier, then finish the snapshot (keyed state: prepare it on the
  loop, write its files in a worker thread), ack, and let keyed state settle;
- on checkpoint-complete n: commit the sink's transactions, tell the backends;
- at end of input: finish the operators, forward end-of-input, and stay alive
  until a checkpoint taken after the end completes, so the last output is
  committed too.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import orjson

from aiostream_ckpt import failpoints
from aiostream_ckpt.aio import BackgroundTasks
from aiostream_ckpt.api.functions import RuntimeContext
from aiostream_ckpt.barrier.handler import BarrierHandler
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier, CheckpointKind
from aiostream_ckpt.checkpoint.coordinator import CheckpointCoordinator
from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint, TaskAck
from aiostream_ckpt.clock import Clock
from aiostream_ckpt.connectors.base import OutputSurvey, SinkWriter, SourceReader
from aiostream_ckpt.errors import AiostreamError, CheckpointError, UserFunctionError
from aiostream_ckpt.runtime.channels import InputGate
from aiostream_ckpt.runtime.elements import (
    ACTIVE,
    END_OF_INPUT,
    IDLE,
    MAX_WATERMARK,
    MIN_WATERMARK,
    PROCESSING_TIME_TICK,
    EndOfInput,
    ProcessingTimeTick,
    Watermark,
    WatermarkStatus,
)
from aiostream_ckpt.runtime.failures import user_function_error
from aiostream_ckpt.runtime.operators import RecordFailed, StreamOperator
from aiostream_ckpt.runtime.partitioners import OutputGate
from aiostream_ckpt.runtime.process_errors import ProcessErrorHandler
from aiostream_ckpt.runtime.side_outputs import SideOutputRouter
from aiostream_ckpt.runtime.writer_state import restored_writer_state
from aiostream_ckpt.state.backend import AsyncSnapshotPart, SnapshotTarget
from aiostream_ckpt.time.checkpointed import TIME_KEY, restored_time, restored_watermark
from aiostream_ckpt.time.timers import ProcessingTimeScheduler, fire_chain, now_millis
from aiostream_ckpt.time.valve import WatermarkValve
from aiostream_ckpt.time.watermarks import WatermarkUpdate

log = logging.getLogger(__name__)

DEAD_LETTER_KEY = "dead_letter"


class TaskState(Enum):
    CREATED = "created"
    RUNNING = "running"
    ENDED = "ended"  # input over, waiting for the checkpoint that commits the last output
    FINISHED = "finished"
    FAILED = "failed"

    def can_become(self, other: TaskState) -> bool:
        return other in _TASK_TRANSITIONS[self]


_TASK_TRANSITIONS = {
    TaskState.CREATED: {TaskState.RUNNING, TaskState.FAILED},
    TaskState.RUNNING: {TaskState.ENDED, TaskState.FAILED},
    TaskState.ENDED: {TaskState.FINISHED, TaskState.FAILED},
    TaskState.FINISHED: set(),
    TaskState.FAILED: set(),
}


@dataclass
class TaskMetrics:
    records_in: int = 0
    records_out: int = 0
    batches_in: int = 0
    last_checkpoint_sync_ms: float = 0.0
    last_alignment_ms: float = 0.0
    #: newest checkpoint whose completion this task has acted on (sink commits done)
    last_notified_checkpoint: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChainSpec:
    """What a task runs; built by the job graph."""

    task_id: str
    subtask: int
    parallelism: int
    operators: list[StreamOperator]
    head_uid: str | None = None
    reader: SourceReader | None = None
    sink_uid: str | None = None
    writer: SinkWriter | None = None
    #: A DeadLetterWriter (malformed input of the source, records whose function raised),
    #: its state kept under ``dead_letter_uid`` (the source's, or the first operator's).
    dead_letter: Any = None
    dead_letter_uid: str | None = None
    #: ``errors.max_process_errors_per_checkpoint`` when ``on_process_error=dead_letter``.
    process_error_limit: int | None = None
    input_gate: InputGate | None = None
    barrier_handler: BarrierHandler | None = None
    outputs: list[OutputGate] = field(default_factory=list)
    #: A ``time.SourceWatermarks`` when the source has a watermark strategy.
    source_watermarks: Any = None
    #: One entry per input edge (upstream uid, parallelism, partitioning): the meaning
    #: of the input channel indexes, compared before restoring per-channel watermarks.
    input_layout: list[str] = field(default_factory=list)


class StreamTask:
    """Runs one :class:`ChainSpec` under the checkpoint protocol."""

    def __init__(
        self,
        spec: ChainSpec,
        *,
        coordinator: CheckpointCoordinator,
        executor: Executor,
        clock: Clock,
        batch_size: int,
        params: dict[str, Any],
        restored: CompletedCheckpoint | None,
    ) -> None:
        self.spec = spec
        self.task_id = spec.task_id
        self._coord = coordinator
        self._executor = executor
        self._clock = clock
        self._batch_size = batch_size
        self._params = params
        self._restored = restored
        #: the checkpoint writers recover to: the restored one's id, None on a fresh
        #: start, 0 when every checkpoint was set aside (all earlier output is newer)
        self.recover_checkpoint_id = restored.checkpoint_id if restored is not None else None
        self._state_restored = self._outputs_recovered = self._closed = False
        self.state = TaskState.CREATED
        self.metrics = TaskMetrics()
        self._lock = asyncio.Lock()
        self._triggers: deque[CheckpointBarrier | ProcessingTimeTick] = deque()
        self._trigger_event = asyncio.Event()
        self._notifications: asyncio.Queue[tuple[bool, int]] = asyncio.Queue()
        self._replay: deque[tuple[int, Any]] = deque()
        self._ended_channels: set[int] = set()
        self._end_checkpoint: int | None = None
        self._done = asyncio.Event()
        self._bg_error: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        self._bg = BackgroundTasks(self._background_failed)
        self._last_watermark = MIN_WATERMARK
        self._restored_time: dict[str, Any] | None = None
        self._valve = WatermarkValve(spec.input_gate.num_channels) if spec.input_gate else None
        self._side = SideOutputRouter.for_chain(spec.operators, spec.outputs)
        self._push_records = self._push if self._side is None else self._push_with_side
        self._process_errors = (
            ProcessErrorHandler(
                spec.operators,
                spec.dead_letter,
                task_id=spec.task_id,
                subtask=spec.subtask,
                limit=spec.process_error_limit,
            )
            if spec.process_error_limit is not None and spec.dead_letter is not None
            else None
        )
        self._backends = [op.backend for op in spec.operators if op.backend is not None]
        self._bind_timers()
        coordinator.register_task(self.task_id, self)
        if spec.reader is not None:
            coordinator.register_source(self.task_id, self)

    # -- lifecycle --------------------------------------------------------------------

    def _transition(self, new: TaskState) -> None:
        if not self.state.can_become(new):
            raise AiostreamError(f"task {self.task_id}: cannot go from {self.state} to {new}")
        self.state = new

    async def run(self) -> None:
        """Open, process until the end (or cancellation), close. Raises on failure."""
        self._transition(TaskState.RUNNING)
        # watched like every background task: a failed commit must fail the task
        self._bg.spawn(self._run_notifier(), f"{self.task_id}-notify")
        work: asyncio.Future[Any] | None = None
        try:
            await self.restore_state()
            await self.recover_outputs()
            main = self._run_source() if self.spec.reader is not None else self._run_input()
            work = asyncio.ensure_future(main)
            watch: set[asyncio.Future[Any]] = {work, self._bg_error}
            done, _ = await asyncio.wait(watch, return_when=asyncio.FIRST_COMPLETED)
            if self._bg_error in done:
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                raise self._bg_error.result()
            work.result()
            self._transition(TaskState.FINISHED)
        except Exception as exc:
            self.state = TaskState.FAILED
            described = self._user_failure(exc)
            if described is not None:
                raise described from exc
            raise
        except BaseException:
            self.state = TaskState.FAILED
            raise
        finally:
            # cancelled while waiting: the record loop must stop before the writer closes
            if work is not None and not work.done():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
            await self._bg.cancel_all()
            await self.close()

    def _user_failure(self, exc: Exception) -> UserFunctionError | None:
        """Name the operator, record and source position when a user function raised."""
        spec = self.spec
        position = None
        if spec.reader is not None and spec.operators:
            try:
                position = spec.reader.snapshot_position()
            except Exception:  # a reader that cannot tell now: report without it
                position = None
        first = spec.operators[0].uid if spec.operators else None
        return user_function_error(exc, source_position=position, first_uid=first)

    def _background_failed(self, exc: BaseException) -> None:
        if not self._bg_error.done():
            self._bg_error.set_result(exc)

    # -- restore, in the job's order: every task's state, then the outputs -------------

    async def restore_state(self) -> None:
        """Rewind the source and restore keyed state (verifying its files); idempotent.

        The job runs this for every task before any task recovers its outputs,
        so a corrupt checkpoint is found before a sink commits or retracts.
        """
        if self._state_restored:
            return
        spec = self.spec
        restored = self._restored
        if restored is not None:
            failpoints.hit("restore_begin")
        if spec.reader is not None:
            positions: dict[str, Any] | None = None
            if restored is not None and spec.head_uid is not None:
                positions = {}
                for st in restored.subtask_states(spec.head_uid).values():
                    positions.update((st.get("operator") or {}).get("positions", {}))
            await spec.reader.start(positions)
        for op in spec.operators:
            if op.backend is not None and restored is not None:
                handles = [
                    st["keyed"]
                    for st in restored.subtask_states(op.uid).values()
                    if st.get("keyed")
                ]
                if handles:
                    await asyncio.get_running_loop().run_in_executor(
                        self._executor, op.backend.restore, restored.root, handles
                    )
            if restored is not None:
                op.restore_state(restored, spec.subtask, spec.parallelism)
            op.open(
                RuntimeContext(
                    operator_uid=op.uid,
                    subtask_index=spec.subtask,
                    parallelism=spec.parallelism,
                    params=self._params,
                    backend=op.backend,
                )
            )
        self._restore_time()
        self._state_restored = True

    def _writers(self) -> list[tuple[Any, str | None, str]]:
        spec = self.spec
        out: list[tuple[Any, str | None, str]] = []
        if spec.dead_letter is not None:
            out.append((spec.dead_letter, spec.dead_letter_uid, DEAD_LETTER_KEY))
        if spec.writer is not None:
            out.append((spec.writer, spec.sink_uid, "writer"))
        return out

    async def survey_outputs(self) -> list[OutputSurvey]:
        """Tell what recovering this task's writers would do (read-only)."""
        out = []
        for writer, uid, key in self._writers():
            survey = getattr(writer, "survey", None)
            if callable(survey):
                state = self._restored_writer_state(uid, key, writer)
                out.append(await asyncio.to_thread(survey, state, self.recover_checkpoint_id))
        return out

    async def recover_outputs(self) -> None:
        """Let the dead-letter writer and the sink commit, abort and retract; idempotent."""
        if self._outputs_recovered:
            return
        if self._restored is not None:
            failpoints.hit("restore_before_sinks")
        for writer, uid, key in self._writers():
            await writer.recover(
                self._restored_writer_state(uid, key, writer), self.recover_checkpoint_id
            )
        self._outputs_recovered = True
        if self._restored is not None:
            failpoints.hit("restore_after_sinks")

    def _restored_writer_state(
        self, uid: str | None, key: str, writer: object
    ) -> dict[str, Any] | None:
        """Own old state, or all old states merged when the parallelism changed."""
        return restored_writer_state(
            self._restored,
            uid,
            key,
            subtask=self.spec.subtask,
            parallelism=self.spec.parallelism,
            writer=writer,
        )

    async def close(self) -> None:
        """Close operators, backends, reader and writers (once; also if never run)."""
        if self._closed:
            return
        self._closed = True
        spec = self.spec
        for op in spec.operators:
            try:
                op.close()
            finally:
                if op.backend is not None:
                    op.backend.close()
        for closer in (spec.reader, spec.writer, spec.dead_letter):
            if closer is not None:
                try:
                    await closer.close()
                except Exception:  # closing after a failure must not hide the failure
                    log.exception("task %s: error while closing %r", self.task_id, closer)

    # -- the record path --------------------------------------------------------------

    async def _push(self, batch: list[Any]) -> None:
        try:
            for op in self.spec.operators:
                batch = op.process_batch(batch)
                if not batch:
                    break
        except RecordFailed as failure:
            batch = self._record_failed(failure)
        self._after_batch()
        if batch:
            await self._emit(batch)

    def _record_failed(self, failure: RecordFailed) -> list[Any]:
        """Finish a batch a user function failed on (dead letters), or fail with its error."""
        if self._process_errors is None:
            raise failure.__cause__ or failure from None  # errors.on_process_error=fail
        return self._process_errors.finish(failure)

    async def _push_tail(self, batch: list[Any]) -> None:
        """Run the chain after its head on ``batch`` (what the head made off the plain path).

        ``_push``'s loop over ``operators[1:]``, kept apart so the per-batch hot
        path gets no extra await.
        """
        try:
            for op in self.spec.operators[1:]:
                batch = op.process_batch(batch)
                if not batch:
                    break
        except RecordFailed as failure:
            batch = self._record_failed(failure)
        self._after_batch()
        if batch:
            await self._emit(batch)
        if self._side is not None:
            await self._side.flush()

    async def _emit(self, batch: list[Any]) -> None:
        self.metrics.records_out += len(batch)
        writer = self.spec.writer
        if writer is not None:
            await writer.write(batch)
            return
        for gate in self.spec.outputs:
            await gate.emit(batch)

    async def _broadcast(self, element: Any) -> None:
        for gate in self.spec.outputs:
            await gate.broadcast_control(element)

    # -- source tasks -----------------------------------------------------------------

    def trigger_checkpoint(self, barrier: CheckpointBarrier) -> None:
        """Inject ``barrier`` before the next batch (called by the coordinator)."""
        self._triggers.append(barrier)
        self._trigger_event.set()

    async def _run_source(self) -> None:
        reader = self.spec.reader
        assert reader is not None
        watermarks = self.spec.source_watermarks
        read = reader.read_batch if watermarks is None else watermarks.read_batch
        after = None if watermarks is None else self._after_source_read
        push = self._push_records
        size = self._batch_size
        triggers = self._triggers
        metrics = self.metrics
        await self._announce_time()
        while True:
            if triggers:
                await self._inject_barriers()
            batch = await read(size)
            if batch is None:
                break
            if batch:
                metrics.records_in += len(batch)
                await push(batch)
            # Free the batch now, while it is cached, not after the next read.
            del batch
            if after is not None:
                await after()
            # Nothing above suspends while the queues have room: yield once per batch
            # so the coordinator's timer, commits and other tasks get to run.
            await asyncio.sleep(0)
        await self._end_input()
        self._coord.source_finished(self.task_id)
        while not self._done.is_set():
            if triggers:
                await self._inject_barriers()
                continue
            self._trigger_event.clear()
            await self._wait_either(self._trigger_event.wait())

    async def _inject_barriers(self) -> None:
        while self._triggers:
            item = self._triggers.popleft()
            if isinstance(item, CheckpointBarrier):
                await self._checkpoint(item, 0.0)
            else:
                await self._fire_processing_timers()

    async def _wait_either(self, aw: Any) -> Any:
        """Await ``aw`` unless the task is done first (then ``None``)."""
        fut = asyncio.ensure_future(aw)
        done_wait = asyncio.ensure_future(self._done.wait())
        done, _ = await asyncio.wait({fut, done_wait}, return_when=asyncio.FIRST_COMPLETED)
        if fut in done:
            done_wait.cancel()
            return fut.result()
        fut.cancel()
        await asyncio.gather(fut, return_exceptions=True)
        return None

    # -- input tasks ------------------------------------------------------------------

    async def _run_input(self) -> None:
        gate = self.spec.input_gate
        assert gate is not None
        handler = self.spec.barrier_handler
        assert handler is not None
        get = gate.queue.get
        push = self._push_records
        replay = self._replay
        metrics = self.metrics
        await self._announce_time()
        while not self._done.is_set():
            if replay:
                channel, element = replay.popleft()
            elif self.state is TaskState.ENDED:
                item = await self._wait_either(get())
                if item is None:
                    break
                channel, element = item
            else:
                channel, element = await get()
            if handler.holding and handler.is_held(channel):
                handler.hold(channel, element)
                continue
            if type(element) is list:
                metrics.records_in += len(element)
                metrics.batches_in += 1
                await push(element)
            else:
                await self._on_control(channel, element)

    async def _on_control(self, channel: int, element: Any) -> None:
        handler = self.spec.barrier_handler
        assert handler is not None
        if isinstance(element, CheckpointBarrier):
            try:
                decision = handler.on_barrier(channel, element)
            except CheckpointError as exc:
                self._coord.decline(element.checkpoint_id, self.task_id, exc)
                return
            if decision is None:
                return
            if decision.barrier is not None:
                self.metrics.last_alignment_ms = decision.alignment_seconds * 1000
                await self._checkpoint(decision.barrier, decision.alignment_seconds)
            self._replay.extendleft(reversed(decision.released))
        elif isinstance(element, Watermark):
            await self._on_watermark(channel, element)
        elif isinstance(element, WatermarkStatus):
            assert self._valve is not None
            await self._apply_watermark_update(self._valve.on_status(channel, idle=element.idle))
        elif isinstance(element, ProcessingTimeTick):
            await self._fire_processing_timers()
        elif isinstance(element, EndOfInput):
            self._ended_channels.add(channel)
            assert self.spec.input_gate is not None
            if len(self._ended_channels) == self.spec.input_gate.num_channels:
                await self._end_input()
            elif self._valve is not None:
                await self._apply_watermark_update(self._valve.on_end(channel))

    # -- event time -------------------------------------------------------------------

    def _time_uids(self) -> list[str | None]:
        """Return the operators whose checkpoint entries carry this task's event time."""
        spec = self.spec
        keyed = [op.uid for op in spec.operators if op.backend is not None]
        return [spec.head_uid, *keyed, spec.sink_uid]

    def _time_snapshot(self) -> dict[str, Any] | None:
        """Return this task's watermark and idleness for the checkpoint (``time.checkpointed``)."""
        spec = self.spec
        if spec.source_watermarks is not None:
            snap: dict[str, Any] = spec.source_watermarks.snapshot()
        elif self._valve is not None:
            snap = {**self._valve.snapshot(), "layout": spec.input_layout}
        else:
            return None
        snap["watermark"] = self._last_watermark
        return snap

    def _restore_time(self) -> None:
        """Resume event time where the checkpoint left it (see ``time.checkpointed``)."""
        spec = self.spec
        time = restored_time(
            self._restored,
            self._time_uids(),
            subtask=spec.subtask,
            parallelism=spec.parallelism,
        )
        if time is None:
            return
        self._restored_time = time
        if spec.source_watermarks is not None:
            spec.source_watermarks.restore(time)
        elif self._valve is not None:
            self._valve.restore(time, channels=time.get("layout") == spec.input_layout)
        self._last_watermark = restored_watermark(time)
        for op in spec.operators:
            op.restore_watermark(self._last_watermark)

    async def _announce_time(self) -> None:
        """Before the first record after a restore: tell downstream the restored event time.

        Their channels from this task then hold what they held at the
        checkpoint, without waiting for this task's next advance.
        """
        time, self._restored_time = self._restored_time, None
        if time is None:
            return
        if self._last_watermark > MIN_WATERMARK:
            await self._broadcast(Watermark(self._last_watermark))
        if time.get("idle"):
            await self._broadcast(IDLE)

    async def _on_watermark(self, channel: int, wm: Watermark) -> None:
        """Take the min over live channels as the task's watermark (see ``time.valve``)."""
        assert self._valve is not None
        await self._apply_watermark_update(self._valve.on_watermark(channel, wm.timestamp))

    async def _after_source_read(self) -> None:
        """Source tasks: send the per-split watermark minimum when it moved."""
        await self._apply_watermark_update(self.spec.source_watermarks.poll())

    async def _apply_watermark_update(self, update: WatermarkUpdate | None) -> None:
        if update is None:
            return
        if update.idle is not None:
            await self._broadcast(IDLE if update.idle else ACTIVE)
        if update.watermark is not None:
            await self._advance_watermark(update.watermark)

    async def _advance_watermark(self, timestamp: int) -> None:
        """Fire the chain's event-time timers, emit what they made, then forward the watermark."""
        self._last_watermark = timestamp
        await self._fire_and_emit(lambda op: op.process_watermark(timestamp))
        await self._broadcast(Watermark(timestamp))

    async def _fire_processing_timers(self) -> None:
        """Fire due processing-time timers (a tick, handled between elements like a barrier)."""
        if self.state is not TaskState.RUNNING:
            return  # after the end of input nothing more is emitted
        now = now_millis(self._clock)
        await self._fire_and_emit(lambda op: op.process_processing_time(now))

    async def _fire_and_emit(self, fire: Callable[[StreamOperator], list[Any]]) -> None:
        """Fire the chain's timers with ``fire``, keep the state caches bounded, emit the output."""
        try:
            out = fire_chain(self.spec.operators, fire)
        except RecordFailed as failure:  # timers' output is not dead-lettered: fail
            raise failure.__cause__ or failure from None
        self._after_batch()
        if out:
            await self._emit(out)
        if self._side is not None:
            await self._side.flush()

    def _after_batch(self) -> None:
        """States do not bound their caches per write (hot path): the task does, per batch."""
        for backend in self._backends:
            backend.after_batch()

    def _bind_timers(self) -> None:
        """Give timer-keeping operators the clock and a way to wake this task."""
        timed = [op for op in self.spec.operators if hasattr(op, "bind_time")]
        if not timed:
            return
        scheduler = ProcessingTimeScheduler(
            self._clock,
            lambda coro, name: self._bg.spawn(coro, name),
            self._wake_for_timers,
            self.task_id,
        )
        for op in timed:
            op.bind_time(scheduler)

    async def _wake_for_timers(self) -> None:
        gate = self.spec.input_gate
        if gate is not None:
            await gate.queue.put((-1, PROCESSING_TIME_TICK))
        else:
            self._triggers.append(PROCESSING_TIME_TICK)
            self._trigger_event.set()

    async def _push_with_side(self, batch: list[Any]) -> None:
        await self._push(batch)
        assert self._side is not None
        await self._side.flush()

    async def _end_input(self) -> None:
        if self._last_watermark < MAX_WATERMARK:
            await self._advance_watermark(MAX_WATERMARK)  # bounded input: all event time is done
        batch: list[Any] = []
        ops = self.spec.operators
        for i, op in enumerate(ops):
            # records flushed by op i still go through the operators after it
            out = op.finish()
            for later in ops[i + 1 :]:
                try:
                    out = later.process_batch(out) if out else out
                except RecordFailed as failure:  # end-of-input flushes are not dead-lettered
                    raise failure.__cause__ or failure from None
            batch.extend(out)
        if batch:
            await self._emit(batch)
        await self._broadcast(END_OF_INPUT)
        self._transition(TaskState.ENDED)

    # -- checkpoints ------------------------------------------------------------------

    async def _checkpoint(self, barrier: CheckpointBarrier, alignment_seconds: float) -> None:
        spec = self.spec
        cid = barrier.checkpoint_id
        mono = self._clock.monotonic
        started = mono()
        states: dict[str, dict[str, Any]] = {}
        parts: list[tuple[str, AsyncSnapshotPart]] = []

        time = self._time_snapshot()
        base: dict[str, Any] = {"subtask": spec.subtask, "parallelism": spec.parallelism}
        if time is not None:
            base[TIME_KEY] = time

        def put(uid: str, **kw: Any) -> None:
            states.setdefault(uid, dict(base)).update(kw)

        async with self._lock:
            targets = self._snapshot_targets(cid)
            op_state: dict[str, Any] = {}
            if spec.reader is not None and spec.head_uid is not None:
                op_state["positions"] = spec.reader.snapshot_position()
            if spec.dead_letter is not None and spec.dead_letter_uid is not None:
                op_state[DEAD_LETTER_KEY] = await spec.dead_letter.prepare_commit(cid)
                if self._process_errors is not None:
                    self._process_errors.barrier()
            if op_state:
                put(spec.dead_letter_uid or spec.head_uid or "", operator=op_state)
            for op in spec.operators:
                if op.backend is not None and targets is not None:
                    parts.append((op.uid, op.backend.snapshot(targets[op.uid])))
                    put(op.uid)
                if (held := op.snapshot_state()) is not None:
                    entry = states.setdefault(op.uid, dict(base))  # may hold its dead letters
                    entry["operator"] = {**(entry.get("operator") or {}), **held}
            if spec.writer is not None and spec.sink_uid is not None:
                roll = getattr(spec.writer, "request_roll", None)  # rolling file sinks
                if roll is not None and (
                    self.state is TaskState.ENDED or barrier.kind is CheckpointKind.SAVEPOINT
                ):
                    roll()  # the last output, or what a savepoint stops with, is closed
                put(spec.sink_uid, operator={"writer": await spec.writer.prepare_commit(cid)})
        sync_seconds = mono() - started
        self.metrics.last_checkpoint_sync_ms = sync_seconds * 1000
        if (
            self.state is TaskState.ENDED
            and self._end_checkpoint is None
            and barrier.kind is CheckpointKind.CHECKPOINT
        ):
            self._end_checkpoint = cid
        await self._broadcast(barrier)
        if targets is None:
            return  # declined: no backend took a snapshot, there is nothing to finish
        self._bg.spawn(
            self._finish_snapshot(cid, states, parts, sync_seconds, alignment_seconds),
            f"{self.task_id}-snapshot-{cid}",
        )

    def _snapshot_targets(self, cid: int) -> dict[str, SnapshotTarget] | None:
        """Where each keyed operator writes checkpoint ``cid``; None when it was declined.

        Created before any backend starts its snapshot, so a storage that cannot
        take them (full, gone) declines the checkpoint, as a failed asynchronous
        write does, and the job goes on within ``checkpoint.tolerable_failures``;
        the barrier still goes downstream and the sink's transaction rolls over
        into the next checkpoint.
        """
        try:
            return {
                op.uid: self._coord.snapshot_target(cid, op.uid, self.spec.subtask)
                for op in self.spec.operators
                if op.backend is not None
            }
        except CheckpointError as exc:
            log.warning("task %s: snapshot %d cannot be stored: %s", self.task_id, cid, exc)
            self._coord.decline(cid, self.task_id, exc)
            return None

    async def _finish_snapshot(
        self,
        cid: int,
        states: dict[str, dict[str, Any]],
        parts: list[tuple[str, AsyncSnapshotPart]],
        sync_seconds: float,
        alignment_seconds: float,
    ) -> None:
        started = self._clock.monotonic()
        loop = asyncio.get_running_loop()
        size = 0
        try:
            for uid, part in parts:
                await part.prepare()  # on the loop, in slices: see AsyncSnapshotPart
                handle = await loop.run_in_executor(self._executor, part.write)
                states[uid]["keyed"] = handle
                size += int(handle.get("size_bytes", 0))
        except Exception as exc:
            log.warning("task %s: asynchronous snapshot %d failed: %s", self.task_id, cid, exc)
            self._coord.decline(cid, self.task_id, exc)
            return
        for st in states.values():
            if st.get("operator") is not None:
                size += len(orjson.dumps(st["operator"]))
        self._coord.acknowledge(
            cid,
            TaskAck(
                task_id=self.task_id,
                states=states,
                sync_seconds=sync_seconds,
                async_seconds=self._clock.monotonic() - started,
                alignment_seconds=alignment_seconds,
                size_bytes=size,
            ),
        )
        for _, part in parts:
            await part.settle()  # deferred work, after the ack

    # -- notifications ----------------------------------------------------------------

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._notifications.put_nowait((True, checkpoint_id))

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._notifications.put_nowait((False, checkpoint_id))

    async def _run_notifier(self) -> None:
        spec = self.spec
        while True:
            complete, cid = await self._notifications.get()
            async with self._lock:
                for op in spec.operators:
                    if op.backend is not None:
                        if complete:
                            op.backend.notify_checkpoint_complete(cid)
                        else:
                            op.backend.notify_checkpoint_aborted(cid)
                if not complete:
                    continue
                if spec.writer is not None:
                    await spec.writer.commit(cid)
                if spec.dead_letter is not None:
                    await spec.dead_letter.commit(cid)
                if spec.reader is not None:
                    await spec.reader.notify_checkpoint_complete(cid)
                self.metrics.last_notified_checkpoint = cid
            # Stay until the job's final checkpoint (taken after *every* source ended)
            # completes: a subtask leaving after its own end would never ack the
            # checkpoints that other, still running sources trigger.
            final = self._coord.finished
            if final.done() and cid >= final.result():
                failpoints.hit("final_committed")
            if (
                self._end_checkpoint is not None
                and cid >= self._end_checkpoint
                and final.done()
                and cid >= final.result()
            ):
                self._done.set()
