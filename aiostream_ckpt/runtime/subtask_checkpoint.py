"""The task's part of a checkpoint (Flink's ``SubtaskCheckpointCoordinatorImpl``).

The task hands barrier n here once it must snapshot: a source task when the
coordinator triggered n, an input task when its barrier handler decided (see
``barrier/``). The steps, numbered as in the code:

1. Snapshot targets: ask the responder where each keyed operator writes n
   (and, for an unaligned n, where the channel state goes). A storage that
   cannot take them (full, gone) declines n here, as a failed write does, and
   the job goes on within ``checkpoint.tolerable_failures``.
2. Synchronous snapshot, under the lock commits take too: each operator's
   pre-barrier flush (``prepare_snapshot_pre_barrier``: state it holds outside
   keyed state goes in), the source's position, the dead letters' pre-commit,
   each keyed backend's synchronous part, operator state, the sink's
   pre-commit (closing a rolling file at the end of input or for a savepoint).
3. Forward barrier n to every output, declined or not: downstream snapshots
   while this task still writes, and a sink's transaction rolls over. An
   unaligned barrier goes ahead of what the outputs have queued.
4. Asynchronous part, in the background: each backend prepares on the loop
   and writes its files in a worker thread (see ``state.backend``). An
   unaligned n also waits for its channel state (complete once barrier n came
   on every input channel: :meth:`in_flight_complete`) and writes it in a
   worker thread (``runtime.channel_state``).
5. For a savepoint, each writer that can (``SavepointHolder``) keeps its own
   copy of the output the savepoint lists as pre-committed, inside the
   savepoint. Then acknowledge n to the responder with the states, sizes and
   timings; or decline it when a write failed.
6. Settle: the backends' deferred work, after the acknowledgement.

When n completes or is aborted (queued, handled in order by
:meth:`run_notifications`):

7. Tell the backends; on completion also commit the sink's and the dead
   letters' transactions and tell the source (Kafka commits its offsets).
8. Once a checkpoint taken after this task's end of input, and after every
   source's end, is committed, set :attr:`done`: the last output is
   committed and the task may leave.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

import orjson

from aiostream_ckpt import failpoints
from aiostream_ckpt.aio import BackgroundTasks
from aiostream_ckpt.barrier.handler import InFlight
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier, CheckpointKind
from aiostream_ckpt.checkpoint.metadata import TaskAck
from aiostream_ckpt.checkpoint.responder import CheckpointResponder
from aiostream_ckpt.clock import Clock
from aiostream_ckpt.connectors.base import CheckpointPositionReader, SavepointHolder
from aiostream_ckpt.errors import CheckpointError
from aiostream_ckpt.runtime.chain import ChainSpec, TaskMetrics
from aiostream_ckpt.runtime.channel_state import CHANNEL_KEY, write_channel_state
from aiostream_ckpt.runtime.process_errors import ProcessErrorHandler
from aiostream_ckpt.state.backend import AsyncSnapshotPart, SnapshotTarget
from aiostream_ckpt.time.checkpointed import TIME_KEY

log = logging.getLogger(__name__)

#: the key of the channel state's target among the keyed operators' (no uid is empty)
_CHANNEL_TARGET = ""
#: A writer that keeps savepoint copies: its operator uid, state key, itself, and where.
_Hold = tuple[str, str, SavepointHolder, SnapshotTarget]
#: Where the sink writer's and the dead-letter writer's states sit in their
#: operators' checkpoint entries (``"operator"``), read back by ``runtime.subtask_restore``.
WRITER_KEY = "writer"
DEAD_LETTER_KEY = "dead_letter"


class SubtaskCheckpointCoordinator:
    """Takes, acknowledges and commits one task's share of every checkpoint."""

    def __init__(
        self,
        spec: ChainSpec,
        *,
        responder: CheckpointResponder,
        finished: asyncio.Future[int],
        executor: Executor,
        clock: Clock,
        background: BackgroundTasks,
        metrics: TaskMetrics,
        broadcast: Callable[[Any], Awaitable[None]],
        time_snapshot: Callable[[], dict[str, Any] | None],
        process_errors: ProcessErrorHandler | None,
    ) -> None:
        self._spec = spec
        self._task_id = spec.task_id
        self._responder = responder
        #: the job's final checkpoint id, once every source ended (the coordinator's)
        self._finished = finished
        self._executor = executor
        self._clock = clock
        self._bg = background
        self._metrics = metrics
        self._broadcast = broadcast
        self._time_snapshot = time_snapshot
        self._process_errors = process_errors
        self._lock = asyncio.Lock()
        self._notifications: asyncio.Queue[tuple[bool, int]] = asyncio.Queue()
        #: set (and replaced) each time a completion was acted on: wakes :meth:`committed`
        self._acted = asyncio.Event()
        self._end_checkpoint: int | None = None
        #: unaligned checkpoints snapshotted here whose channel state is not complete yet
        self._in_flight: dict[int, asyncio.Future[InFlight]] = {}
        #: Set once the output this task made before its end is committed (step 8).
        self.done = asyncio.Event()

    def decline(self, checkpoint_id: int, reason: BaseException) -> None:
        """Tell the responder this task cannot take ``checkpoint_id`` (e.g. alignment overflow)."""
        self._responder.decline(checkpoint_id, self._task_id, reason)

    def in_flight_complete(self, in_flight: InFlight) -> None:
        """Hand an unaligned checkpoint its channel state: its last barrier came (step 4)."""
        fut = self._in_flight.pop(in_flight.checkpoint_id, None)
        if fut is None or fut.done():
            return
        if in_flight.error is not None:
            fut.set_exception(in_flight.error)
        else:
            fut.set_result(in_flight)

    def abandon(self, checkpoint_id: int) -> None:
        """Give up ``checkpoint_id`` here: a newer barrier overtook it; decline it."""
        reason = CheckpointError(
            f"task {self._task_id}: a newer barrier came before checkpoint {checkpoint_id} "
            "was complete here",
            retriable=True,
        )
        fut = self._in_flight.pop(checkpoint_id, None)
        if fut is not None and not fut.done():
            fut.set_exception(reason)  # its asynchronous part declines it
        else:
            self.decline(checkpoint_id, reason)

    async def checkpoint(
        self, barrier: CheckpointBarrier, alignment_seconds: float, *, ended: bool
    ) -> None:
        """Snapshot at ``barrier`` and forward it; ``ended``: after the task's end of input."""
        spec = self._spec
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

        in_flight: asyncio.Future[InFlight] | None = None
        if barrier.unaligned and spec.input_uid is not None:
            in_flight = self._in_flight[cid] = asyncio.get_running_loop().create_future()
            put(spec.input_uid)
        async with self._lock:
            # 1. where keyed state goes, and the channel state (or decline)
            targets = self._snapshot_targets(cid, spec.input_uid if in_flight else None)
            holds = None
            if targets is not None and barrier.kind is CheckpointKind.SAVEPOINT:
                holds = self._hold_targets(cid)  # ... and a savepoint's copies of the output
                if holds is None:
                    targets = None
            # 2. the synchronous snapshot
            for op in spec.operators:
                op.prepare_snapshot_pre_barrier(cid)  # before any backend freezes its writes
            failpoints.hit("pre_barrier_flush")
            op_state: dict[str, Any] = {}
            if spec.reader is not None and spec.head_uid is not None:
                reader = spec.reader
                op_state["positions"] = (
                    reader.snapshot_position_for(cid)
                    if isinstance(reader, CheckpointPositionReader)
                    else reader.snapshot_position()
                )
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
                if roll is not None and (ended or barrier.kind is CheckpointKind.SAVEPOINT):
                    roll()  # the last output, or what a savepoint stops with, is closed
                put(spec.sink_uid, operator={WRITER_KEY: await spec.writer.prepare_commit(cid)})
        sync_seconds = mono() - started
        self._metrics.last_checkpoint_sync_ms = sync_seconds * 1000
        if ended and self._end_checkpoint is None and barrier.kind is CheckpointKind.CHECKPOINT:
            self._end_checkpoint = cid
        await self._broadcast(barrier)  # 3. forward
        if targets is None:
            if in_flight is not None:
                del self._in_flight[cid]
            return  # declined: no backend took a snapshot, there is nothing to finish
        channel_target = targets.pop(_CHANNEL_TARGET, None)
        self._bg.spawn(
            self._finish(
                cid,
                states,
                parts,
                sync_seconds,
                alignment_seconds,
                (in_flight, channel_target) if in_flight is not None else None,
                holds or [],
            ),
            f"{self._task_id}-snapshot-{cid}",
        )

    def _snapshot_targets(
        self, cid: int, channel_uid: str | None
    ) -> dict[str, SnapshotTarget] | None:
        """Where each keyed operator writes checkpoint ``cid``; None when it was declined.

        With a ``channel_uid``, also where the channel state goes (under
        ``_CHANNEL_TARGET``). Created before any backend starts its snapshot, so
        a storage that cannot take them declines before any work is done.
        """
        subtask = self._spec.subtask
        try:
            targets = {
                op.uid: self._responder.snapshot_target(cid, op.uid, subtask)
                for op in self._spec.operators
                if op.backend is not None
            }
            if channel_uid is not None:
                targets[_CHANNEL_TARGET] = self._responder.snapshot_target(
                    cid, channel_uid, subtask
                )
            return targets
        except CheckpointError as exc:
            log.warning("task %s: snapshot %d cannot be stored: %s", self._task_id, cid, exc)
            self.decline(cid, exc)
            return None

    def _hold_targets(self, cid: int) -> list[_Hold] | None:
        """Where each writer of the task keeps savepoint ``cid``'s copies; None: declined."""
        spec = self._spec
        writers: list[tuple[str, str, object]] = []
        if spec.dead_letter is not None and spec.dead_letter_uid is not None:
            writers.append((spec.dead_letter_uid, DEAD_LETTER_KEY, spec.dead_letter))
        if spec.writer is not None and spec.sink_uid is not None:
            writers.append((spec.sink_uid, WRITER_KEY, spec.writer))
        try:
            return [
                (uid, key, writer, self._responder.snapshot_target(cid, uid, spec.subtask))
                for uid, key, writer in writers
                if isinstance(writer, SavepointHolder)
            ]
        except CheckpointError as exc:
            log.warning("task %s: savepoint %d cannot be stored: %s", self._task_id, cid, exc)
            self.decline(cid, exc)
            return None

    async def _finish(
        self,
        cid: int,
        states: dict[str, dict[str, Any]],
        parts: list[tuple[str, AsyncSnapshotPart]],
        sync_seconds: float,
        alignment_seconds: float,
        channels: tuple[asyncio.Future[InFlight], SnapshotTarget | None] | None,
        holds: list[_Hold],
    ) -> None:
        """Run steps 4 to 6 in the background, while the task processes on."""
        started = self._clock.monotonic()
        loop = asyncio.get_running_loop()
        size = in_flight_bytes = in_flight_records = 0
        try:  # 4. the asynchronous part
            for uid, part in parts:
                await part.prepare()  # on the loop, in slices: see AsyncSnapshotPart
                handle = await loop.run_in_executor(self._executor, part.write)
                states[uid]["keyed"] = handle
                size += int(handle.get("size_bytes", 0))
            if channels is not None:
                in_flight_bytes, in_flight_records = await self._write_channels(states, *channels)
                size += in_flight_bytes
            for uid, key, writer, target in holds:  # 5. a savepoint's copies of the output
                entry = states[uid]["operator"]
                entry[key] = await writer.hold_for_savepoint(
                    cid, entry[key], target.exclusive_dir / f"held-{key}", target.root
                )
        except Exception as exc:
            log.warning("task %s: asynchronous snapshot %d failed: %s", self._task_id, cid, exc)
            self.decline(cid, exc)  # 5. ... or decline
            return
        if holds:
            failpoints.hit("savepoint_snapshot")
        for st in states.values():
            if st.get("operator") is not None:
                size += len(orjson.dumps(st["operator"]))
        self._responder.acknowledge(  # 5. acknowledge
            cid,
            TaskAck(
                task_id=self._task_id,
                states=states,
                sync_seconds=sync_seconds,
                async_seconds=self._clock.monotonic() - started,
                alignment_seconds=alignment_seconds,
                size_bytes=size,
                unaligned=channels is not None,
                in_flight_bytes=in_flight_bytes,
                in_flight_records=in_flight_records,
            ),
        )
        m = self._metrics
        if m.last_acked_checkpoint is None or cid > m.last_acked_checkpoint:  # may finish late
            m.last_acked_checkpoint, m.last_checkpoint_size_bytes = cid, size
            m.last_in_flight_bytes = in_flight_bytes
        for _, part in parts:
            await part.settle()  # 6. deferred work, after the ack

    async def _write_channels(
        self,
        states: dict[str, dict[str, Any]],
        in_flight: asyncio.Future[InFlight],
        target: SnapshotTarget | None,
    ) -> tuple[int, int]:
        """Wait for the channel state, write it (a worker thread); return its bytes, records."""
        spec = self._spec
        done = await in_flight
        assert target is not None and spec.input_uid is not None
        handle = await asyncio.get_running_loop().run_in_executor(
            self._executor,
            write_channel_state,
            target.exclusive_dir,
            target.root,
            done.channels,
            spec.input_layout,
        )
        self._metrics.last_in_flight_seconds = done.seconds
        if handle is None:
            return 0, 0
        states[spec.input_uid][CHANNEL_KEY] = handle
        return int(handle["size_bytes"]), int(handle["records"])

    # -- notifications (the coordinator's CheckpointListener) --------------------------

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._notifications.put_nowait((True, checkpoint_id))

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._notifications.put_nowait((False, checkpoint_id))

    async def committed(self, checkpoint_id: int) -> None:
        """Return once a completion of ``checkpoint_id`` or a later one was acted on (step 7)."""
        while (self._metrics.last_notified_checkpoint or 0) < checkpoint_id:
            await self._acted.wait()

    async def run_notifications(self) -> None:
        """Act on completions and aborts in order (steps 7 and 8); runs until cancelled."""
        spec = self._spec
        while True:
            complete, cid = await self._notifications.get()
            async with self._lock:  # 7. backends, then commits
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
                self._metrics.last_notified_checkpoint = cid
                self._acted.set()
                self._acted = asyncio.Event()
            # 8. Stay until the job's final checkpoint (taken after *every* source ended)
            # completes: a subtask leaving after its own end would never ack the
            # checkpoints that other, still running sources trigger.
            final = self._finished
            if final.done() and cid >= final.result():
                failpoints.hit("final_committed")
            if (
                self._end_checkpoint is not None
                and cid >= self._end_checkpoint
                and final.done()
                and cid >= final.result()
            ):
                self.done.set()
