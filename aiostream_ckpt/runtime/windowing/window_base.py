"""The window operator's core: keyed window contents, their timers, firing and lateness.

Per key, one map state holds every open window of that key, ``(start, end) ->
contents`` (an accumulator, a reduced value, or the list of elements); session
windows keep theirs apart (:mod:`~aiostream_ckpt.runtime.windowing.session_windows`).
Timers: one at ``window.max_timestamp`` to fire, one at ``max_timestamp +
allowed_lateness`` to drop the contents. A timer carries no window, only a
time; on a timer the operator fires/cleans the key's windows whose time it
is. So a key's timers follow its live windows, whatever its history.

Lateness follows Flink: a window is late once ``max_timestamp +
allowed_lateness <= watermark``; a record whose windows are all late goes to
the late side output (or is dropped and counted), nowhere else. A record for a
window whose time has passed but that is not late yet fires it again at once,
with the updated result.

Why a module of its own: this is what every window operator shares (the
general record path, firing, timers and lateness). The tumbling windows'
buffer and fast path (:mod:`~aiostream_ckpt.runtime.windowing.tumbling_windows`) and the
restore of the timers at open (:mod:`~aiostream_ckpt.runtime.windowing.window_operator`)
build on it, each in its own module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast, get_args

from aiostream_ckpt.jobspec.functions import Collector
from aiostream_ckpt.jobspec.graph import WindowKind, WindowSpec
from aiostream_ckpt.jobspec.watermarks import MIN_WATERMARK
from aiostream_ckpt.jobspec.window_functions import (
    AggregateFunction,
    ProcessWindowFunction,
    WindowContext,
)
from aiostream_ckpt.jobspec.windows import TimeWindow
from aiostream_ckpt.runtime.operators import RecordFailed, StreamOperator
from aiostream_ckpt.runtime.windowing.session_timers import SessionTimers
from aiostream_ckpt.state.backend import KeyContext
from aiostream_ckpt.state.codecs import EXACT_SCALARS, UNTYPED, StateTypeError, value_codec
from aiostream_ckpt.time.timers import (
    DerivedEventTimers,
    InternalTimerService,
    ProcessingTimeScheduler,
)

#: The map state of each key's open windows, ``(start, end) -> contents``.
WINDOW_CONTENTS = "window-contents"
#: The contents of a window that has none yet (a new window).
MISSING = object()
#: Held windows or keys above which a batch's end writes them into keyed state, when the
#: state cache (``state.cache_max_entries``) allows more: a flush per batch past it costs
#: what a barrier's does, and memory stays bounded with checkpoints off.
MAX_HELD = 50_000


_DECLARE = {
    WindowKind.AGGREGATE: "accumulator_type= on aggregate()",
    WindowKind.REDUCE: "value_type= on reduce()",
    WindowKind.PROCESS: "element_type= on process()",
}


def contents_check(spec: WindowSpec, uid: str, state: str) -> Callable[[list[Any]], None]:
    """Return the check of what a batch put into windows, as their keyed state would.

    It takes a list of a process window's records (elements), else of the
    accumulators or reduced values. Why: the tumbling buffer and the held
    sessions reach keyed state only at the pre-barrier flush, so a value their
    codec refuses failed there, at a checkpoint, far from its record, and only
    when its window was open at a barrier (one that fired before never reached
    the state): whether the job failed depended on checkpoint timing. Checked
    once a batch, the same input fails the same way in every run. Untyped
    values are checked in one encoding of the batch's containers (a record
    each, one by one, cost 60 % of a process window's record path).
    """
    tp = spec.state_type
    if spec.kind is WindowKind.PROCESS and tp is not None:
        (tp,) = get_args(tp)  # list[element_type]
    codec = value_codec(spec.serializer, tp, state=state)
    one, declare = codec.check, _DECLARE[spec.kind]
    untyped = codec is UNTYPED

    def check(values: list[Any]) -> None:
        if untyped:
            rest = [v for v in values if v.__class__ not in EXACT_SCALARS]
            if not rest:
                return
            if all(v.__class__ in _BATCHED for v in rest):
                try:
                    one(rest, state)  # what each would read back as, in one round trip
                    return
                except StateTypeError:
                    pass  # name the first misfit below
            values = rest
        try:
            for v in values:
                one(v, state)
        except StateTypeError as exc:
            raise StateTypeError(f"window {uid!r}: {exc} (for a window: {declare})") from None

    return check


#: untyped values checked together: a list holds them as each would be stored
_BATCHED = frozenset({list, dict, float})


class WindowOperatorBase(StreamOperator):
    """Fixed windows' contents, timers and firing, with the general record path.

    :class:`~aiostream_ckpt.runtime.windowing.window_operator.WindowOperator` is the one
    the runtime builds: this class opens nothing (the key context, the map
    state and the timers are set by its ``open``).
    """

    keyed = True
    #: the keyed state the windows' contents go to (named in refusals)
    contents_state = WINDOW_CONTENTS
    #: the backend's key context, set at ``open``
    _kc: KeyContext

    def __init__(self, uid: str, spec: WindowSpec, key_selector: Callable[[Any], Any]) -> None:
        super().__init__(uid)
        self.spec = spec
        self._key_selector = key_selector
        self._ts = spec.timestamp_assigner
        self._lateness = spec.allowed_lateness
        # The function as ``spec.kind`` reads it, bound once: the record path pays no narrowing.
        self._aggregate = cast("AggregateFunction[Any, Any, Any]", spec.function)
        self._reduce = cast("Callable[[Any, Any], Any]", spec.function)
        self._process = cast("ProcessWindowFunction[Any, Any, Any]", spec.function)
        self._scheduler: ProcessingTimeScheduler | None = None
        self._timers: InternalTimerService | DerivedEventTimers | SessionTimers | None = None
        self._contents: Any = None
        self._out: Collector[Any] = Collector()
        self.watermark = MIN_WATERMARK
        #: Entries held in memory between barriers (tumbling windows, sessions' keys) above
        #: which a batch's end writes them into keyed state: ``MAX_HELD``, or the state
        #: cache's size if smaller (set at ``open``), so bounding the cache bounds them too.
        self.max_held = MAX_HELD
        #: Late records dropped because nobody reads the late side output.
        self.late_dropped = 0
        #: ``(key, max_timestamp)`` of restored windows that fired and wait for their
        #: cleanup: a timer at their end fires them no more (see ``WindowOperator``);
        #: kept until the watermark passes their end (a session grown since leaves its own).
        self._restored_fired: set[tuple[Any, int]] = set()
        #: refuses what a record adds to a window that its state would (see contents_check)
        self._check_contents = contents_check(spec, uid, self.contents_state)

    def bind_time(self, scheduler: ProcessingTimeScheduler) -> None:
        self._scheduler = scheduler

    def close(self) -> None:
        for fn in (self.spec.window_function, self.spec.function):
            if isinstance(fn, ProcessWindowFunction):
                fn.close()

    # -- records ------------------------------------------------------------------------

    def process_batch(self, batch: list[Any]) -> list[Any]:
        """Add each record to its windows (see :meth:`_add_batch`).

        The key selector, timestamp assigner and aggregate/reduce function run
        here (a failure is ``RecordFailed``, as in every record loop), and a
        late firing's window function, which handles its own: :meth:`_fire`.
        """
        out: list[Any] = []
        self._out.collect = out.append
        return self._add_batch(batch, out)

    def _add_batch(self, batch: list[Any], out: list[Any]) -> list[Any]:
        """Fold a batch into fixed windows: one state read and write per (key, window).

        Why: a record's window is mostly one that other records of the batch
        share (a busy key's current window), and a state read and put cost more
        than the fold itself. The watermark does not move within a batch, so
        whether a window is due is fixed for the batch: a due window (late
        firing: it fires again per record) takes the per-record path, every
        other window is folded here and written back once, at the end.
        """
        kc = self._kc
        ks = self._key_selector
        tsf = self._ts
        bounds = self.spec.assigner.bounds
        base, write = self._fold_base, self._write
        fold, fold_owned = self._fold, self._fold_owned
        lateness, watermark = self._lateness, self.watermark  # no timer fires in a batch
        folded: dict[tuple[Any, tuple[int, int]], Any] = {}
        it = iter(batch)
        try:
            for rec in it:
                key = ks(rec)
                skipped = True
                for window in bounds(tsf(rec)):
                    max_ts = window[1] - 1
                    if max_ts + lateness <= watermark:
                        continue
                    skipped = False
                    if max_ts <= watermark:  # due: fires now, with this record in it
                        kc.key = key
                        self._add_due(key, window, rec)
                        continue
                    kw = (key, window)
                    acc = folded.get(kw, MISSING)
                    if acc is MISSING:
                        kc.key = key
                        acc = base(key, window)
                        if acc is MISSING:
                            self._set_timers(max_ts)
                        folded[kw] = fold(acc, rec)
                    else:
                        folded[kw] = fold_owned(acc, rec)
                if skipped:
                    self._late(rec)
        except Exception as exc:  # what the records before it folded is written back below
            raise RecordFailed(self, batch, it, out) from exc
        finally:
            for (key, window), acc in folded.items():
                kc.key = key
                write(key, window, acc)
        return out

    def _fold_base(self, key: Any, window: tuple[int, int]) -> Any:
        """Return the current key's window to fold a batch's records into (``MISSING``: new)."""
        return self._contents.get(window, MISSING)

    def _write(self, key: Any, window: tuple[int, int], value: Any) -> None:
        """Write what a batch folded into the current key's window (from :meth:`_fold_base`)."""
        self._contents.put(window, value)

    def _add_due(self, key: Any, window: tuple[int, int], record: Any) -> None:
        """Add ``record`` to the current key's window, due already, and fire it (late firing)."""
        contents = self._contents
        value = self._fold(contents.get(window, MISSING), record)
        contents.put(window, value)
        self._fire_due(window[0], window[1], value)

    def _fire_due(self, start: int, end: int, value: Any) -> None:
        """Fire a due window (a record came before its cleanup); keep its cleanup timer set."""
        self._fire(TimeWindow(start, end), value)
        timers = self._timers
        assert timers is not None
        timers.register_event_time_timer(end - 1 + self._lateness)

    def _late(self, record: Any) -> None:
        side = self.side_output
        if side is not None and self.spec.late_tag is not None:
            side.append((self.spec.late_tag, record))
        else:
            self.late_dropped += 1

    def _fold(self, current: Any, record: Any) -> Any:
        """Return a window's contents with ``record`` added (``MISSING``: a new window)."""
        kind = self.spec.kind
        if kind is WindowKind.AGGREGATE:
            fn = self._aggregate
            return fn.add(record, fn.create_accumulator() if current is MISSING else current)
        if kind is WindowKind.REDUCE:
            return record if current is MISSING else self._reduce(current, record)
        # A new list each time: the state may still hold the old one for a snapshot.
        return [record] if current is MISSING else [*current, record]

    def _first(self, record: Any) -> Any:
        """Return the contents of a new window holding ``record``."""
        return self._fold(MISSING, record)

    def _fold_owned(self, current: Any, record: Any) -> Any:
        """Like :meth:`_fold`, for contents the batch owns: a list ``_fold`` made grows in place."""
        if self.spec.kind is WindowKind.PROCESS:
            current.append(record)
            return current
        return self._fold(current, record)

    def _set_timers(self, max_ts: int) -> None:
        """Set a window's timers: fire at ``max_ts``, clean up after the lateness."""
        timers = self._timers
        assert timers is not None
        timers.register_event_time_timer(max_ts)
        if self._lateness:
            timers.register_event_time_timer(max_ts + self._lateness)

    # -- time ---------------------------------------------------------------------------

    def process_watermark(self, timestamp: int) -> list[Any]:
        assert self._timers is not None
        if timestamp > self.watermark:
            self.watermark = timestamp
        out: list[Any] = []
        self._out.collect = out.append
        self._advance_timers(timestamp)
        if self._restored_fired:  # the timers at their ends have fired; none is set again
            self._restored_fired = {e for e in self._restored_fired if e[1] > timestamp}
        return out

    def _advance_timers(self, timestamp: int) -> None:
        """Fire the timers at or before ``timestamp``."""
        assert self._timers is not None
        self._timers.advance_watermark(timestamp, self._on_timer)

    def restore_watermark(self, timestamp: int) -> None:
        assert self._timers is not None
        self.watermark = max(self.watermark, timestamp)
        self._timers.restore_watermark(timestamp)
        if self._restored_fired:
            self._clean_up_restored()

    def _clean_up_restored(self) -> None:
        """Restored windows that fired and whose cleanup the watermark passed (hook)."""

    def _on_timer(self, timestamp: int, key: Any) -> int | None:
        """Fire the windows due at ``timestamp``; a time returned re-arms ``key``'s timer there."""
        contents = self._contents
        lateness, fired = self._lateness, self._restored_fired
        for raw, value in list(contents.items()):
            window = TimeWindow(*raw)
            max_ts = window.end - 1
            if max_ts == timestamp and not (fired and (key, max_ts) in fired):
                self._fire(window, self._whole(key, raw, value))
            if max_ts + lateness == timestamp:
                self._remove(key, raw)
                fired.discard((key, max_ts))
        return None

    def _whole(self, key: Any, window: tuple[int, int], stored: Any) -> Any:
        """Return the current key's window whole, given its stored value."""
        return stored

    def _remove(self, key: Any, window: tuple[int, int]) -> None:
        """Remove the current key's window from state."""
        self._contents.remove(window)

    def _fire(self, window: TimeWindow, value: Any) -> None:
        spec = self.spec
        kind = spec.kind
        fn: object = spec.function
        step = "get_result"
        try:
            if kind is WindowKind.AGGREGATE:
                result = self._aggregate.get_result(value)
            elif kind is WindowKind.REDUCE:
                result = value
            else:
                step = "process"
                context = WindowContext(window, self.watermark)
                self._process.process(self._kc.key, context, value, self._out)
                return
            window_fn = spec.window_function
            if window_fn is None:
                self._out.collect(result)
            else:
                fn, step = window_fn, "process"
                window_fn.process(
                    self._kc.key, WindowContext(window, self.watermark), [result], self._out
                )
        except Exception as exc:
            # dead-lettered (the contents stay until the window's cleanup), or the job fails
            fired = {"key": self._kc.key, "window": [window.start, window.end], "contents": value}
            self.user_function_failed(f"{type(fn).__name__}.{step}", "window", fired, exc)

    @property
    def timer_service(self) -> InternalTimerService | DerivedEventTimers | SessionTimers | None:
        return self._timers
