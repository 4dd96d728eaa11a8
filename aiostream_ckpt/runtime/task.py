"""A task: one parallel instance of a chain of operators, run as one asyncio task.

The task is the loop: it reads batches from its source reader or its input
gate, and control elements between them, and hands each to the part that owns
it, one module each:

- records: :class:`~.operator_chain.OperatorChain` runs the operators, sends the output on;
- barrier n (a source task: once the coordinator's trigger, queued in
  :class:`~.source_triggers.SourceTriggers`, comes up between two reads; an
  input task: once its ``barrier/`` handler decides) and checkpoint-complete n:
  :class:`~.subtask_checkpoint.SubtaskCheckpointCoordinator` snapshots,
  forwards, acknowledges through the responder, and commits;
- watermarks, idleness and timers: :class:`~.event_time.TaskEventTime`;
- restore, in the job's order (``runtime.failover.recovery``):
  :class:`~.subtask_restore.SubtaskRestore`.

At end of input the task finishes the operators, forwards end-of-input, and
stays alive until a checkpoint taken after the end completes, so the last
output is committed too.
"""

from __future__ import annotations

import asyncio
from collections import deque
from concurrent.futures import Executor
from typing import Any

from aiostream_ckpt import failpoints
from aiostream_ckpt.aio import BackgroundTasks, unless_failed, unless_set
from aiostream_ckpt.barrier.alternating import AlternatingBarrierHandler
from aiostream_ckpt.barrier.handler import BarrierDecision
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier
from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.checkpoint.responder import TaskCoordinator
from aiostream_ckpt.clock import Clock
from aiostream_ckpt.connectors.base import OutputSurvey
from aiostream_ckpt.errors import AiostreamError, CheckpointError
from aiostream_ckpt.runtime.chain import ChainSpec, TaskMetrics, TaskState
from aiostream_ckpt.runtime.elements import (
    END_OF_INPUT,
    PROCESSING_TIME_TICK,
    AlignmentTimeout,
    EndOfInput,
    ProcessingTimeTick,
    Watermark,
    WatermarkStatus,
)
from aiostream_ckpt.runtime.event_time import TaskEventTime
from aiostream_ckpt.runtime.operator_chain import OperatorChain
from aiostream_ckpt.runtime.source_triggers import SourceTriggers
from aiostream_ckpt.runtime.subtask_checkpoint import SubtaskCheckpointCoordinator
from aiostream_ckpt.runtime.subtask_restore import SubtaskRestore


class StreamTask:
    """Runs one :class:`ChainSpec` under the checkpoint protocol."""

    def __init__(
        self,
        spec: ChainSpec,
        *,
        coordinator: TaskCoordinator,
        executor: Executor,
        clock: Clock,
        batch_size: int,
        params: dict[str, Any],
        restored: CompletedCheckpoint | None,
    ) -> None:
        self.spec = spec
        self.task_id = spec.task_id
        self._coord = coordinator
        self._clock = clock
        self._batch_size = batch_size
        self._params = params
        self._restore = SubtaskRestore(spec, restored, executor=executor, params=params)
        self._closed = False
        self.state = TaskState.CREATED
        self.metrics = TaskMetrics()
        #: elements to take before the gate's: held ones an alignment released, and
        #: after a restore the in-flight ones of an unaligned checkpoint
        self._replay: deque[tuple[int, Any]] = deque()
        #: restored in-flight elements not replayed yet, and how many are left when the
        #: ``channel_state_replay`` fail point is passed (half way)
        self._restored_left = self._restored_hit_at = 0
        self._ended_channels: set[int] = set()
        self._bg_error: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        self._bg = BackgroundTasks(self._background_failed)
        self._chain = chain = OperatorChain(spec, self.metrics)
        self._time = TaskEventTime(
            spec,
            clock=clock,
            advance=self._advance_watermark,
            broadcast=chain.broadcast,
            emit=chain.emit_fired,
            finish=chain.operator_failed,
        )
        self._time.bind_timers(self._bg.spawn, self._wake_for_timers)
        self._checkpoints = SubtaskCheckpointCoordinator(
            spec,
            responder=coordinator,
            finished=coordinator.finished,
            executor=executor,
            clock=clock,
            background=self._bg,
            metrics=self.metrics,
            broadcast=chain.broadcast,
            time_snapshot=self._time.snapshot,
            process_errors=chain.process_errors,
        )
        #: set once the task's last output is committed (see the checkpoint component)
        self._done = self._checkpoints.done
        coordinator.register_task(self.task_id, self._checkpoints)
        gate, handler = spec.input_gate, spec.barrier_handler
        timed = isinstance(handler, AlternatingBarrierHandler) and handler.aligned_timeout > 0
        if gate is not None and timed:  # checkpoint.aligned_timeout: each barrier is timed
            gate.queue.on_announce = self._barrier_announced
        self._timed: set[int] = set()
        self._triggers = SourceTriggers(
            lambda b: self._checkpoint(b, 0.0), self._fire_processing_timers, spec.reader_wakeup
        )
        if spec.reader is not None:
            coordinator.register_source(self.task_id, self._triggers)

    @property
    def watermark(self) -> int:
        """The task's current event-time watermark (milliseconds; the minimum before any)."""
        return self._time.watermark

    # -- lifecycle --------------------------------------------------------------------

    def _transition(self, new: TaskState) -> None:
        if not self.state.can_become(new):
            raise AiostreamError(f"task {self.task_id}: cannot go from {self.state} to {new}")
        self.state = new

    async def run(self) -> None:
        """Open, process until the end (or cancellation), close. Raises on failure."""
        self._transition(TaskState.RUNNING)
        # watched like every background task: a failed commit must fail the task
        self._bg.spawn(self._checkpoints.run_notifications(), f"{self.task_id}-notify")
        try:
            await self.restore_state()
            await self.recover_outputs()
            main = self._run_source() if self.spec.reader is not None else self._run_input()
            # a background task's failure stops the record loop before the writer closes
            await unless_failed(main, self._bg_error)
            self._transition(TaskState.FINISHED)
        except Exception as exc:
            self.state = TaskState.FAILED
            described = self._chain.describe_failure(exc)
            if described is not None:
                raise described from exc
            raise
        except BaseException:
            self.state = TaskState.FAILED
            raise
        finally:
            await self._bg.cancel_all()
            await self.close()

    def _background_failed(self, exc: BaseException) -> None:
        if not self._bg_error.done():
            self._bg_error.set_result(exc)

    # -- restore, in the job's order (see runtime.subtask_restore) ----------------------

    @property
    def recover_checkpoint_id(self) -> int | None:
        """The checkpoint writers recover to (0: every checkpoint was set aside)."""
        return self._restore.checkpoint_id

    @recover_checkpoint_id.setter
    def recover_checkpoint_id(self, checkpoint_id: int | None) -> None:
        self._restore.checkpoint_id = checkpoint_id

    async def restore_state(self) -> None:
        """Rewind the source, restore state, open the operators, resume event time; once.

        An unaligned checkpoint's in-flight elements are replayed first, before
        the gate is read.
        """
        await self._restore.restore_state(lambda r: self._time.restore(r, self._time_uids()))
        in_flight = self._restore.take_in_flight()
        if in_flight:
            self._replay.extend(in_flight)
            self._restored_left = len(in_flight)
            self._restored_hit_at = len(in_flight) // 2

    async def survey_outputs(self) -> list[OutputSurvey]:
        return await self._restore.survey_outputs()

    async def recover_outputs(self) -> None:
        await self._restore.recover_outputs()

    async def close(self) -> None:
        """Close operators, backends, reader and writers (once; also if never run)."""
        if not self._closed:
            self._closed = True
            await self._chain.close()

    def request_roll(self) -> None:
        """Have a rolling file sink close its open part file at the next checkpoint."""
        roll = getattr(self.spec.writer, "request_roll", None)
        if roll is not None:
            roll()

    async def committed(self, checkpoint_id: int) -> None:
        """Return once this task committed ``checkpoint_id``'s output, or has none left to commit.

        A worker confirms commits with it (``runtime.workers.worker_attempt``): a stop
        waits for the sinks in the workers, as a single process's waits for its tasks.
        """
        await unless_set(self._checkpoints.committed(checkpoint_id), self._done)

    # -- source tasks -----------------------------------------------------------------

    async def _run_source(self) -> None:
        reader = self.spec.reader
        assert reader is not None
        watermarks = self.spec.source_watermarks
        push = self._chain.push
        size = self._batch_size
        triggers = self._triggers
        metrics = self.metrics
        time = self._time
        await time.announce()
        while True:
            if triggers:
                await triggers.run()
            if watermarks is None:
                batch = await reader.read_batch(size)
                if batch is None:
                    break
                if batch:
                    metrics.records_in += len(batch)
                    await push(batch)
                # Free the batch now, while it is cached, not after the next read.
                del batch
            else:
                # cut where event time moves, each cut's records before its watermark
                segments = await watermarks.read_segments(size)
                if segments is None:
                    break
                for records, update in segments:
                    if records:
                        metrics.records_in += len(records)
                        await push(records)
                    if update is not None:
                        await time.send_source_update(update)
                del segments, records
                await time.after_source_read()
            # Nothing above suspends while the queues have room: yield once per batch
            # so the coordinator's timer, commits and other tasks get to run.
            await asyncio.sleep(0)
        await self._end_input()
        self._coord.source_finished(self.task_id)
        await triggers.serve_until(self._done)

    # -- input tasks ------------------------------------------------------------------

    async def _run_input(self) -> None:
        gate = self.spec.input_gate
        assert gate is not None
        handler = self.spec.barrier_handler
        assert handler is not None
        get = gate.queue.get
        push = self._chain.push
        replay = self._replay
        metrics = self.metrics
        await self._time.announce()
        while not self._done.is_set():
            if replay:
                channel, element = self._take_replay()
            elif self.state is TaskState.ENDED:
                item = await unless_set(get(), self._done)
                if item is None:
                    break
                channel, element = item
            else:
                channel, element = await get()
            if handler.holding and handler.is_held(channel) and handler.hold(channel, element):
                continue
            if type(element) is list:
                metrics.records_in += len(element)
                metrics.batches_in += 1
                await push(element)
            else:
                await self._on_control(channel, element)

    def _take_replay(self) -> tuple[int, Any]:
        """Return the next element to replay; an unaligned barrier that came goes first."""
        gate = self.spec.input_gate
        assert gate is not None
        if gate.queue.has_priority:
            return gate.queue.get_nowait()  # it overtakes the replay too: in_line counts it
        if self._restored_left:
            self._restored_left -= 1
            if self._restored_left == self._restored_hit_at:
                failpoints.hit("channel_state_replay")
        return self._replay.popleft()

    async def _on_control(self, channel: int, element: Any) -> None:
        handler = self.spec.barrier_handler
        assert handler is not None
        if isinstance(element, CheckpointBarrier):
            in_line: list[Any] = []
            if element.unaligned and handler.keeps_in_flight:
                # what it overtook on its channel, in line to be processed: in flight
                assert self.spec.input_gate is not None
                in_line, _ = self.spec.input_gate.in_line(
                    channel, element.checkpoint_id, self._replay
                )
            try:
                decision = handler.on_barrier(channel, element, in_line)
            except CheckpointError as exc:
                self._checkpoints.decline(element.checkpoint_id, exc)
                return
            await self._decided(decision)
        elif isinstance(element, AlignmentTimeout):
            await self._decided(handler.on_alignment_timeout(element.barrier))
        elif isinstance(element, Watermark):
            await self._time.on_watermark(channel, element.timestamp)
        elif isinstance(element, WatermarkStatus):
            await self._time.on_status(channel, idle=element.idle)
        elif isinstance(element, ProcessingTimeTick):
            await self._fire_processing_timers()
        elif isinstance(element, EndOfInput):
            self._ended_channels.add(channel)
            assert self.spec.input_gate is not None
            if len(self._ended_channels) == self.spec.input_gate.num_channels:
                await self._end_input()
            else:
                await self._time.on_channel_end(channel)

    async def _decided(self, decision: BarrierDecision | None) -> None:
        """Do what the barrier handler decided: give up, snapshot, hand over, replay."""
        if decision is None:
            return
        if decision.abandoned is not None:
            self._checkpoints.abandon(decision.abandoned)
        if decision.prioritize is not None:  # turned unaligned here: its barriers go ahead
            assert self.spec.input_gate is not None
            self.spec.input_gate.queue.prioritize(decision.prioritize)
        if decision.barrier is not None:
            self.metrics.last_alignment_ms = decision.alignment_seconds * 1000
            await self._checkpoint(decision.barrier, decision.alignment_seconds)
        if decision.in_flight is not None:
            self._checkpoints.in_flight_complete(decision.in_flight)
        self._replay.extendleft(reversed(decision.released))

    def _barrier_announced(self, barrier: CheckpointBarrier) -> None:
        """Start ``barrier``'s alignment timer as its first barrier reaches the gate."""
        cid = barrier.checkpoint_id
        if cid in self._timed:
            return
        self._timed = {c for c in self._timed if c > cid - 8}  # only recent ones matter
        self._timed.add(cid)
        self._bg.spawn(self._alignment_timer(barrier), f"{self.task_id}-align-{cid}")

    async def _alignment_timer(self, barrier: CheckpointBarrier) -> None:
        handler, gate = self.spec.barrier_handler, self.spec.input_gate
        assert isinstance(handler, AlternatingBarrierHandler) and gate is not None
        await self._clock.sleep(handler.aligned_timeout)
        gate.queue.put_priority((-1, AlignmentTimeout(barrier)))  # the handler decides

    # -- event time (see runtime.event_time) ------------------------------------------

    def _time_uids(self) -> list[str | None]:
        """Return the operators whose checkpoint entries carry this task's event time."""
        spec = self.spec
        keyed = [op.uid for op in spec.operators if op.backend is not None]
        return [spec.head_uid, *keyed, spec.sink_uid]

    async def _advance_watermark(self, timestamp: int) -> None:
        """Fire timers and forward the new watermark ``timestamp`` (a subclass may defer it)."""
        await self._time.advance(timestamp)

    async def _fire_processing_timers(self) -> None:
        if self.state is TaskState.RUNNING:  # after the end of input nothing more is emitted
            await self._time.fire_processing_timers()

    async def _wake_for_timers(self) -> None:
        gate = self.spec.input_gate
        if gate is not None:
            await gate.queue.put((-1, PROCESSING_TIME_TICK))
        else:
            self._triggers.timers_due()

    async def _end_input(self) -> None:
        await self._time.end()
        await self._chain.finish()
        await self._chain.broadcast(END_OF_INPUT)
        self._transition(TaskState.ENDED)

    # -- checkpoints (see runtime.subtask_checkpoint) ---------------------------------

    async def _checkpoint(self, barrier: CheckpointBarrier, alignment_seconds: float) -> None:
        ended = self.state is TaskState.ENDED
        await self._checkpoints.checkpoint(barrier, alignment_seconds, ended=ended)
