"""Records whose user function raised: dead-lettered once, the batch goes on after them.

``errors.on_process_error=dead_letter`` turns a poison pill (a record the
function cannot handle, on every replay) from a job that restarts until it
gives up into one dead letter: the record, the operator uid and the
traceback, written to the task's dead-letter output in the open checkpoint
epoch, so it is committed exactly once with the checkpoint that covers the
record. ``errors.max_process_errors_per_checkpoint`` bounds them: more in one
task between two barriers is a broken function, not a bad record, and fails
the job.

The no-error path pays nothing per record: operators run their loops as
before, inside one ``try`` per batch (:class:`~aiostream_ckpt.runtime.operators.RecordFailed`).
Only a failed batch is finished here, from the failing record on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from aiostream_ckpt.connectors.staging import DeadLetterWriter
from aiostream_ckpt.errors import RecordError
from aiostream_ckpt.runtime.operators import RecordFailed, StreamOperator
from aiostream_ckpt.runtime.record_errors import is_record_error

log = logging.getLogger(__name__)


class ProcessErrorHandler:
    """Finishes a failed batch of one task, dead-lettering each record that raised."""

    def __init__(
        self,
        operators: Sequence[StreamOperator],
        dead_letter: DeadLetterWriter,
        *,
        task_id: str,
        subtask: int,
        limit: int,
    ) -> None:
        self._ops = list(operators)
        self._dead_letter = dead_letter
        self._task_id = task_id
        self._subtask = subtask
        self._limit = limit
        self._since_barrier = 0
        self.total = 0

    def barrier(self) -> None:
        """Start counting afresh: a checkpoint barrier passed."""
        self._since_barrier = 0

    def finish(self, failure: RecordFailed) -> list[Any]:
        """Return what the chain emits for ``failure.batch``, the failing records left out.

        Raises the function's own error when it is not the record's (see
        :func:`is_record_error`), and :class:`RecordError` past the bound.
        """
        first = self._ops.index(failure.operator)
        batch = self._run(failure.operator, failure.batch, failure)
        for op in self._ops[first + 1 :]:
            if not batch:
                break
            batch = self._run(op, batch, None)
        return batch

    def finish_operator(self, failure: RecordFailed) -> list[Any]:
        """Return what ``failure.operator`` alone emits for its batch, the failing records left out.

        For batches the task runs operator by operator (timer output, end-of-input flushes).
        """
        return self._run(failure.operator, failure.batch, failure)

    def _run(self, op: StreamOperator, batch: list[Any], failure: RecordFailed | None) -> list[Any]:
        """Return what ``op`` emits for ``batch`` (counted in its ``records_out``)."""
        out = self._run_uncounted(op, batch, failure)
        op.records_out += len(out)
        return out

    def _run_uncounted(
        self, op: StreamOperator, batch: list[Any], failure: RecordFailed | None
    ) -> list[Any]:
        out: list[Any] = []
        process: Callable[[list[Any]], list[Any]] = op.process_batch
        while True:
            if failure is None:
                try:
                    out.extend(process(batch))
                    return out
                except RecordFailed as again:
                    failure = again
            cause = failure.__cause__
            if cause is None or not is_record_error(cause):
                raise cause or failure
            process = failure.resume or process
            k = failure.index
            if failure.out is not None:
                out.extend(failure.out)
            elif k:
                out.extend(process(batch[:k]))  # stateless: computed again
            self._dead_letter_one(op.uid, batch[k], cause, copy=failure.broadcast)
            batch, failure = batch[k + 1 :], None
            if not batch:
                return out

    def dead_letter(
        self, uid: str, record: Any, exc: BaseException, function: str | None = None
    ) -> None:
        """Dead-letter ``record`` whose function failed outside a batch.

        An async call, a key selector in the shuffle, a timer or a window
        firing: ``function`` names it when it is not the operator's own.
        """
        if not is_record_error(exc):
            raise exc
        self._dead_letter_one(uid, record, exc, function)

    def _dead_letter_one(
        self,
        uid: str,
        record: Any,
        exc: BaseException,
        function: str | None = None,
        *,
        copy: bool = False,
    ) -> None:
        """Count the failed record and write its dead letter (a ``copy``: instance 0 writes it).

        ``copy``: a broadcast record, which every instance got and failed on;
        each leaves it out (so their broadcast states stay the same) but only
        instance 0 writes it, so it is dead-lettered once at any parallelism.
        """
        self._since_barrier += 1
        self.total += 1
        if self._since_barrier > self._limit:
            raise RecordError(
                f"task {self._task_id}: more than {self._limit} records failed in operator "
                f"{uid!r} since the last checkpoint (errors.max_process_errors_per_checkpoint); "
                f"the last: {type(exc).__name__}: {exc}"
            ) from exc
        if copy and self._subtask != 0:
            log.debug("task %s: broadcast record left out after %r in %s", self._task_id, exc, uid)
            return
        self._dead_letter.add_failed_record(record, uid, self._subtask, exc, function)
        log.debug("task %s: record dead-lettered after %r in %s", self._task_id, exc, uid)
