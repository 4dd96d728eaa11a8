"""Operators: batch-at-a-time steps of a task's chain.

Each operator turns one input batch into one output batch. Stateless ones are
list comprehensions; keyed ones set the key context and call user code per
record. Keeping the per-record work inside one Python loop per batch is what
makes the engine fast: a queue hop costs about as much as a few hundred
records of ``map``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.errors import AiostreamError
from aiostream_ckpt.jobspec.functions import (
    Collector,
    Context,
    KeyedProcessFunction,
    ProcessFunction,
    RuntimeContext,
)
from aiostream_ckpt.runtime.record_errors import dead_letter_or_raise
from aiostream_ckpt.runtime.return_watch import ReturnWatch
from aiostream_ckpt.state.backend import KeyContext, KeyedStateBackend
from aiostream_ckpt.state.descriptors import ValueStateDescriptor

log = logging.getLogger(__name__)


class RecordFailed(AiostreamError):
    """A user function raised on ``batch[index]``; raised from the original error.

    ``out`` is what the operator produced for ``batch[:index]``, or ``None``
    for stateless operators, whose records before the failing one the task
    computes again (their functions are expected to be pure). The task either
    re-raises the original error (``errors.on_process_error=fail``) or
    dead-letters the record and goes on after it. Finding the index costs
    nothing per record: the loops run over an iterator, whose remaining
    length tells where it stopped. ``resume`` runs the rest of the batch when
    that is not ``operator.process_batch`` (a second input). ``broadcast``:
    the record came on a broadcast input, so every instance failed on it and
    instance 0 alone dead-letters it.
    """

    broadcast = False

    def __init__(
        self,
        operator: StreamOperator,
        batch: list[Any],
        it: Any,
        out: list[Any] | None,
        resume: Callable[[list[Any]], list[Any]] | None = None,
    ) -> None:
        super().__init__(f"operator {operator.uid!r} failed on a record", retriable=True)
        self.operator = operator
        self.batch = batch
        self.index = len(batch) - it.__length_hint__() - 1
        self.out = out
        self.resume = resume

    def __str__(self) -> str:
        cause = self.__cause__
        return f"{self.args[0]}: {type(cause).__name__}: {cause}" if cause else self.args[0]


class StreamOperator(ABC):
    """One step of a chain. ``backend`` is set for keyed operators before :meth:`open`."""

    keyed = False
    #: ``(tag, record)`` pairs for side outputs; the job graph sets a list on
    #: operators whose side outputs someone reads, the task drains it.
    side_output: list[tuple[Any, Any]] | None = None
    #: The task's ``ProcessErrorHandler`` under ``errors.on_process_error=dead_letter``;
    #: ``None`` (fail) otherwise. Used by :meth:`user_function_failed`.
    process_errors: Any = None
    #: Records this operator emitted on its main output (Flink's operator
    #: ``numRecordsOut``): from batches, timers and its end-of-input flush. The
    #: task counts them once per batch, never per record (``runtime.operator_chain``);
    #: what goes into operator ``i`` is what operator ``i - 1`` emitted.
    records_out = 0

    def __init__(self, uid: str) -> None:
        self.uid = uid
        self.backend: KeyedStateBackend | None = None

    def open(self, ctx: RuntimeContext) -> None:  # noqa: B027 - optional hook
        """Prepare for the first batch (state is already restored)."""

    def user_function_failed(self, function: str, what: str, record: Any, exc: Exception) -> None:
        """User code outside the record loop raised on ``record`` (a timer, a window firing).

        Under ``errors.on_process_error=dead_letter`` the record goes to the
        dead-letter output (naming ``function``) and this returns: the caller
        goes on with the next timer or window. Otherwise raises the job's
        error, naming the function, this operator and the record (``what``
        says what kind of record it is).
        """
        dead_letter_or_raise(self.process_errors, function, self.uid, what, record, exc)

    @abstractmethod
    def process_batch(self, batch: list[Any]) -> list[Any]:
        """Turn ``batch`` into the records it produces (an empty list when none)."""

    def finish(self) -> list[Any]:
        """End of input: records still to emit (e.g. final windows)."""
        return []

    def end_batch(self) -> None:
        """Tidy up after a batch (or a timer firing) went through the chain.

        Keyed operators let their backend bound its state caches here: states
        do not check their size per write (the hot path), and the backend
        adapts its read paths to the batch just processed. The chain calls it
        for operators with a backend only, once per batch.
        """
        backend = self.backend
        if backend is not None:
            backend.after_batch()

    def process_watermark(self, timestamp: int) -> list[Any]:
        """Event time reached ``timestamp``: fire timers, return what they emit."""
        return []

    def process_processing_time(self, now_ms: int) -> list[Any]:
        """Processing-time timers due at ``now_ms`` fire; return what they emit."""
        return []

    def restore_watermark(self, timestamp: int) -> None:  # noqa: B027 - optional hook
        """Event time restored from a checkpoint (after :meth:`open`): take it as current.

        Fires nothing: timers at or before it fire on the next advance, as they
        would have without the restart.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; called on success and on failure."""

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:  # noqa: B027 - hook
        """Write what the operator holds outside keyed state into it, before a snapshot.

        Flink's ``prepareSnapshotPreBarrier``. Called for every checkpoint and
        savepoint ``checkpoint_id``, in the synchronous part, before any
        operator's :attr:`backend` snapshot or :meth:`snapshot_state` and before
        the barrier is forwarded: what it writes is in the snapshot, which thus
        holds the state as of the barrier. Why: an operator may keep hot state
        in plain Python between barriers (open windows) and pay the keyed-state
        writes once per checkpoint, not per batch. It must not emit records and
        must leave what later records compute unchanged (it only moves state).
        """

    def snapshot_state(self) -> dict[str, Any] | None:
        """JSON-able operator state for the checkpoint (keyed state goes through ``backend``)."""
        return None

    def restore_state(  # noqa: B027 - optional hook
        self, restored: CompletedCheckpoint, subtask: int, parallelism: int
    ) -> None:
        """Take this instance's share of the operator state of ``restored`` (before ``open``)."""


class MapOperator(StreamOperator):
    def __init__(self, uid: str, fn: Callable[[Any], Any]) -> None:
        super().__init__(uid)
        self._fn = fn

    def process_batch(self, batch: list[Any]) -> list[Any]:
        it = iter(batch)
        try:
            return list(map(self._fn, it))
        except Exception as exc:
            raise RecordFailed(self, batch, it, None) from exc


class FilterOperator(StreamOperator):
    def __init__(self, uid: str, fn: Callable[[Any], bool]) -> None:
        super().__init__(uid)
        self._fn = fn

    def process_batch(self, batch: list[Any]) -> list[Any]:
        it = iter(batch)
        try:
            return list(filter(self._fn, it))
        except Exception as exc:
            raise RecordFailed(self, batch, it, None) from exc


class FlatMapOperator(StreamOperator):
    def __init__(self, uid: str, fn: Callable[[Any], Iterable[Any]]) -> None:
        super().__init__(uid)
        self._fn = fn

    def process_batch(self, batch: list[Any]) -> list[Any]:
        fn = self._fn
        it = iter(batch)
        try:
            return [y for x in it for y in fn(x)]
        except Exception as exc:
            raise RecordFailed(self, batch, it, None) from exc


class ProcessOperator(StreamOperator):
    """Runs a non-keyed :class:`ProcessFunction`; the keyed variant sets the key first."""

    def __init__(self, uid: str, function: ProcessFunction[Any, Any]) -> None:
        super().__init__(uid)
        self.function = function
        self._ctx = Context()
        self._out: Collector[Any] = Collector()

    def open(self, ctx: RuntimeContext) -> None:
        # the job graph set side_output (when someone reads one) before open
        self._ctx = Context(side_output=self.side_output)
        self.function.open(ctx)
        if not isinstance(self.function, ReturnWatch):  # opened again by a later attempt
            self.function = ReturnWatch(self, log)  # type: ignore[assignment]  # see ReturnWatch

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return self._run(batch, self.function.process_element)

    def _run(
        self, batch: list[Any], pe: Callable[..., Any], resume: Callable[..., Any] | None = None
    ) -> list[Any]:
        """Call ``pe`` on every record of ``batch``: the loop of every process operator.

        Two-input operators run either input's method through it; ``resume``
        runs the rest of a failed batch of their second input (RecordFailed).
        """
        out: list[Any] = []
        col = self._out
        col.collect = out.append
        ctx = self._ctx
        it = iter(batch)
        try:
            for rec in it:
                pe(rec, ctx, col)
        except Exception as exc:
            raise RecordFailed(self, batch, it, out, resume) from exc
        finally:
            col.detach()  # see KeyedProcessOperator._run_keyed
        return out

    def close(self) -> None:
        self.function.close()


class KeyedProcessOperator(ProcessOperator):
    """Runs a :class:`KeyedProcessFunction`: sets the current key, then calls it."""

    keyed = True

    def __init__(
        self,
        uid: str,
        function: KeyedProcessFunction[Any, Any],
        key_selector: Callable[[Any], Any],
    ) -> None:
        super().__init__(uid, function)
        self._key_selector = key_selector
        self._key_context = KeyContext()  # the backend's, from open()

    def open(self, ctx: RuntimeContext) -> None:
        assert self.backend is not None
        self._key_context = self.backend.key_context
        super().open(ctx)

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return self._run_keyed(batch, self.function.process_element, self._key_selector)

    def _run_keyed(
        self,
        batch: list[Any],
        pe: Callable[..., Any],
        ks: Callable[[Any], Any],
        resume: Callable[..., Any] | None = None,
    ) -> list[Any]:
        """:meth:`_run` under each record's key (``ks``): the loop of every keyed one."""
        out: list[Any] = []
        col = self._out
        col.collect = out.append
        ctx = self._ctx
        kc = self._key_context
        it = iter(batch)
        try:
            for rec in it:
                # the states read the backend's key, the function ctx.current_key
                kc.key = ctx.current_key = ks(rec)
                pe(rec, ctx, col)
        except Exception as exc:
            raise RecordFailed(self, batch, it, out, resume) from exc
        finally:
            # Let go of the output batch: the task frees it right after the sink wrote
            # it, while it is still in the CPU cache (held until the next batch, it
            # was freed after the next batch's parse: ~3 % of pv_count's time).
            col.detach()
        return out


class ReduceOperator(StreamOperator):
    """``key_by(...).reduce(fn)``: keeps the folded value per key, emits it on every record."""

    keyed = True

    def __init__(
        self,
        uid: str,
        fn: Callable[[Any, Any], Any],
        key_selector: Callable[[Any], Any],
        value_type: Any = None,
    ) -> None:
        super().__init__(uid)
        self._fn = fn
        self._key_selector = key_selector
        self._value_type = value_type
        self._state: Any = None

    def open(self, ctx: RuntimeContext) -> None:
        self._state = ctx.get_state(ValueStateDescriptor("reduce", self._value_type))

    def process_batch(self, batch: list[Any]) -> list[Any]:
        assert self.backend is not None
        kc = self.backend.key_context
        ks = self._key_selector
        fn = self._fn
        value = self._state.value
        update = self._state.update
        out: list[Any] = []
        append = out.append
        it = iter(batch)
        try:
            for rec in it:
                kc.key = ks(rec)
                acc = value()
                acc = rec if acc is None else fn(acc, rec)
                update(acc)
                append(acc)
        except Exception as exc:
            raise RecordFailed(self, batch, it, out) from exc
        return out
