"""A task's record path (Flink's ``OperatorChain``): a batch through the operators, then out.

A batch goes through the chain's operators, one call each, and what comes out
goes to the sink writer or the output gates; side outputs follow it. Each
operator's ``records_out`` grows by its output's length per call (per batch,
not per record): its records in are the previous one's out, the first one's
the task's ``records_in``. A record
whose user function raised is dead-lettered or fails the task
(``runtime.process_errors``). Nothing here suspends between operators: the only
awaits are the writes to the sink or the channels, which is where
backpressure reaches the task.
"""

from __future__ import annotations

import logging
from typing import Any

from aiostream_ckpt.connectors.base import RecordFunctions
from aiostream_ckpt.errors import UserFunctionError
from aiostream_ckpt.runtime.chain import ChainSpec, TaskMetrics
from aiostream_ckpt.runtime.failures import user_function_error
from aiostream_ckpt.runtime.operators import RecordFailed
from aiostream_ckpt.runtime.partitioners import KeyGroupGate
from aiostream_ckpt.runtime.process_errors import ProcessErrorHandler
from aiostream_ckpt.runtime.record_errors import record_error_policy
from aiostream_ckpt.runtime.side_outputs import SideOutputGate, SideOutputRouter

log = logging.getLogger(__name__)


class OperatorChain:
    """Runs batches through one task's operators and sends the output on."""

    def __init__(self, spec: ChainSpec, metrics: TaskMetrics) -> None:
        self._spec = spec
        self._metrics = metrics
        self._side = SideOutputRouter.for_chain(spec.operators, spec.outputs)
        #: set when ``errors.on_process_error=dead_letter``: failed records become dead letters
        self.process_errors = (
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
        self._bind_process_errors()
        self._keyed = [op for op in spec.operators if op.backend is not None]
        #: the task's per-batch call: the whole chain, then the side outputs if any
        self.push = self._push if self._side is None else self._push_with_side

    async def _push(self, batch: list[Any]) -> None:
        try:
            for op in self._spec.operators:
                batch = op.process_batch(batch)
                op.records_out += len(batch)
                if not batch:
                    break
        except RecordFailed as failure:
            batch = self._record_failed(failure)
        self._end_batch()
        if batch:
            await self.emit(batch)

    async def _push_with_side(self, batch: list[Any]) -> None:
        await self._push(batch)
        assert self._side is not None
        await self._side.flush()

    def _bind_process_errors(self) -> None:
        """Give the places that run user code outside a batch loop the policy (None: fail).

        Operators' timers and window firings, the key selectors of keyed outputs,
        the source's timestamp assigner and the sink's serializer.
        """
        handler = self.process_errors
        spec = self._spec
        for op in spec.operators:
            op.process_errors = handler
        for gate in spec.outputs:
            inner = gate.inner if isinstance(gate, SideOutputGate) else gate
            if isinstance(inner, KeyGroupGate):
                inner.process_errors = handler
        if spec.source_watermarks is not None and spec.head_uid is not None:
            spec.source_watermarks.record_failed = record_error_policy(handler, spec.head_uid)
        if isinstance(spec.writer, RecordFunctions) and spec.sink_uid is not None:
            spec.writer.record_failed = record_error_policy(handler, spec.sink_uid)

    def _record_failed(self, failure: RecordFailed) -> list[Any]:
        """Finish a batch a user function failed on (dead letters), or fail with its error."""
        if self.process_errors is None:
            raise failure.__cause__ or failure from None  # errors.on_process_error=fail
        return self.process_errors.finish(failure)

    #: the chain's output for a batch its head failed on off the plain path (a second input)
    finish_failed = _record_failed

    def operator_failed(self, failure: RecordFailed) -> list[Any]:
        """As ``finish_failed``, for ``failure.operator`` alone: the caller runs the rest.

        For batches run operator by operator: timer output, end-of-input flushes.
        """
        if self.process_errors is None:
            raise failure.__cause__ or failure from None
        return self.process_errors.finish_operator(failure)

    async def push_tail(self, batch: list[Any]) -> None:
        """Run the chain after its head on ``batch`` (what the head made off the plain path).

        ``push``'s loop over ``operators[1:]``, kept apart so the per-batch hot
        path gets no extra await.
        """
        try:
            for op in self._spec.operators[1:]:
                batch = op.process_batch(batch)
                op.records_out += len(batch)
                if not batch:
                    break
        except RecordFailed as failure:
            batch = self._record_failed(failure)
        self._end_batch()
        if batch:
            await self.emit(batch)
        if self._side is not None:
            await self._side.flush()

    async def emit_fired(self, out: list[Any]) -> None:
        """Send what fired timers or a finished failed batch made (through the chain already)."""
        self._end_batch()
        if out:
            await self.emit(out)
        if self._side is not None:
            await self._side.flush()

    def _end_batch(self) -> None:
        """Let keyed operators tidy their state after the batch (``StreamOperator.end_batch``)."""
        for op in self._keyed:
            op.end_batch()

    async def emit(self, batch: list[Any]) -> None:
        self._metrics.records_out += len(batch)
        writer = self._spec.writer
        if writer is not None:
            await writer.write(batch)
            return
        for gate in self._spec.outputs:
            await gate.emit(batch)

    async def broadcast(self, element: Any) -> None:
        """Send a control element (barrier, watermark, end of input) on every output."""
        for gate in self._spec.outputs:
            await gate.broadcast_control(element)

    async def finish(self) -> None:
        """End of input: emit what the operators still hold (final windows, flushes)."""
        batch: list[Any] = []
        ops = self._spec.operators
        for i, op in enumerate(ops):
            # records flushed by op i still go through the operators after it
            out = op.finish()
            op.records_out += len(out)
            for later in ops[i + 1 :]:
                if not out:
                    break
                try:
                    out = later.process_batch(out)
                    later.records_out += len(out)
                except RecordFailed as failure:
                    out = self.operator_failed(failure)  # counted by the handler
            batch.extend(out)
        if batch:
            await self.emit(batch)

    def describe_failure(self, exc: Exception) -> UserFunctionError | None:
        """Name the operator, record and source position when a user function raised."""
        spec = self._spec
        position = None
        if spec.reader is not None and spec.operators:
            try:
                position = spec.reader.snapshot_position()
            except Exception:  # a reader that cannot tell now: report without it
                position = None
        first = spec.operators[0].uid if spec.operators else None
        return user_function_error(exc, source_position=position, first_uid=first)

    async def close(self) -> None:
        """Close operators, backends, reader and writers (also after a failure)."""
        spec = self._spec
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
                    log.exception("task %s: error while closing %r", spec.task_id, closer)
