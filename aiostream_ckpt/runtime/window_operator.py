"""The window operator: keyed window contents and timers, all in keyed state.

Per key, one map state holds every open window of that key, ``(start, end) ->
contents`` (an accumulator, a reduced value, or the list of elements); session
windows keep theirs apart (:mod:`~aiostream_ckpt.runtime.session_windows`).
Timers: one at ``window.max_timestamp`` to fire, one at ``max_timestamp +
allowed_lateness`` to drop the contents. A timer carries no window, only a
time; on a timer the operator fires/cleans the key's windows whose time it
is. So a key's timers follow its live windows, whatever its history. With
allowed lateness they are the operator's :class:`InternalTimerService`
(keyed state too); without, the windows in state are exactly the unfired
ones, so the timers are kept in memory and derived from them when the
operator opens (:meth:`WindowOperator._derive_timers`). A restore with
another allowed lateness (savepoint) fires no window twice: a window that
fired and waits for its cleanup is cleaned up at its end plus the new
lateness (at once without lateness), re-emitted only on a late record.

Tumbling windows (a plain :class:`TumblingEventTimeWindows`) keep the
contents changed since the last checkpoint in memory, ``(key, start) ->
contents``, and write them to the map state just before each snapshot
(:meth:`WindowOperator.prepare_snapshot_pre_barrier`); a window that fires
before the next barrier never touches the state. Why: a record's window is
mostly still open at the next batch, and a state read and put per (key,
window) per batch cost the operator as much as the rest of its work (the
snapshot holds the same windows either way: those open at the barrier).

Lateness follows Flink: a window is late once ``max_timestamp +
allowed_lateness <= watermark``; a record whose windows are all late goes to
the late side output (or is dropped and counted), nowhere else. A record for a
window whose time has passed but that is not late yet fires it again at once,
with the updated result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

from aiostream_ckpt.jobspec.functions import Collector, RuntimeContext
from aiostream_ckpt.jobspec.graph import WindowKind, WindowSpec
from aiostream_ckpt.jobspec.watermarks import MIN_WATERMARK
from aiostream_ckpt.jobspec.window_functions import (
    AggregateFunction,
    ProcessWindowFunction,
    WindowContext,
)
from aiostream_ckpt.jobspec.windows import TimeWindow, TumblingEventTimeWindows
from aiostream_ckpt.runtime.operators import RecordFailed, StreamOperator
from aiostream_ckpt.state.descriptors import MapStateDescriptor
from aiostream_ckpt.time.timers import (
    EVENT_TIMERS,
    DerivedEventTimers,
    InternalTimerService,
    ProcessingTimeScheduler,
)

WINDOW_CONTENTS = "window-contents"
_MISSING = object()


class WindowOperator(StreamOperator):
    keyed = True

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
        assigner = spec.assigner
        #: ``(size, offset)`` when every record is in one size-aligned window (tumbling)
        self._tumbling = (
            (assigner.size, assigner.offset)
            if isinstance(assigner, TumblingEventTimeWindows)
            and type(assigner).bounds is TumblingEventTimeWindows.bounds
            else None
        )
        self._scheduler: ProcessingTimeScheduler | None = None
        self._timers: InternalTimerService | DerivedEventTimers | None = None
        self._contents: Any = None
        #: tumbling: ``(key, start) -> contents`` of windows changed since the last flush
        self._buffer: dict[tuple[Any, int], Any] = {}
        #: tumbling: the ``(key, start)`` windows that are in the map state (written or restored)
        self._stored: set[tuple[Any, int]] = set()
        self._out: Collector[Any] = Collector()
        self.watermark = MIN_WATERMARK
        #: Late records dropped because nobody reads the late side output.
        self.late_dropped = 0

    def bind_time(self, scheduler: ProcessingTimeScheduler) -> None:
        self._scheduler = scheduler

    def open(self, ctx: RuntimeContext) -> None:
        assert self.backend is not None
        self._kc = self.backend.key_context
        self._contents = self.backend.create_state(
            MapStateDescriptor(
                WINDOW_CONTENTS, None, self.spec.state_type, serializer=self.spec.serializer
            )
        )
        timers = self._timers = InternalTimerService(self.backend)
        if self._scheduler is not None:
            timers.bind(self._scheduler)
        timers.open()
        self._open_windows()
        if self._lateness:
            self._arm_stored_windows()
        else:
            self._derive_timers()
        self._index_stored()
        if self.spec.window_function is not None:
            self.spec.window_function.open(ctx)
        if isinstance(self.spec.function, ProcessWindowFunction):
            self.spec.function.open(ctx)

    def _open_windows(self) -> None:
        """Restore (or migrate) window state of the operator's own, before its timers."""

    def _index_stored(self) -> None:
        """Tumbling: note the windows restored in state; another size turns the fast path off.

        A savepoint taken with another window size holds windows that the
        tumbling path (which finds a window from its end) would not find:
        they take the general path, as every window of this instance then.
        """
        self._buffer = {}
        stored = self._stored = set()
        if self._tumbling is None:
            return
        assert self.backend is not None
        size = self._tumbling[0]
        for key in list(self.backend.keys(WINDOW_CONTENTS)):
            self._kc.key = key
            for start, end in list(self._contents.keys()):
                if end - start != size:
                    self._tumbling = None
                    stored.clear()
                    self._kc.key = None
                    return
                stored.add((key, start))
        self._kc.key = None

    def _window_ends(self) -> Iterator[tuple[Any, int]]:
        """``(key, max_timestamp)`` of every window in state; sets the key context to ``key``."""
        assert self.backend is not None
        kc, contents = self._kc, self._contents
        for key in list(self.backend.keys(WINDOW_CONTENTS)):
            kc.key = key
            for window in list(contents.keys()):
                yield key, window[1] - 1

    def _derive_timers(self) -> None:
        """Without allowed lateness, keep the timers in memory: each stored window's end.

        A window is in state until its end fires, and then it is dropped (a
        record for a window whose end has passed is late), so the stored
        windows are the timers: registered again here after a restore, not
        stored. Why: a stored timer cost a map put when set, a remove when it
        fired and their LMDB records at the checkpoint, per window (and per
        growing session, ~0.4 per click). A checkpoint taken with allowed
        lateness stores its timers: they are cleared, and its windows that
        fired and waited for their cleanup are dropped (due now, not fired
        again: :meth:`_first_stored_timers`). With allowed lateness a fired
        window stays until its cleanup, and whether its end has fired is known
        only from its timers: those stay in keyed state.
        """
        assert self.backend is not None
        backend, kc = self.backend, self._kc
        stored = backend.create_state(MapStateDescriptor(EVENT_TIMERS))
        for key, first in self._first_stored_timers().items():
            kc.key = key
            stored.clear()
            self._drop_fired(first)
        timers = self._timers = DerivedEventTimers(backend)
        for _key, max_ts in self._window_ends():
            timers.register_event_time_timer(max_ts)
        kc.key = None

    def _first_stored_timers(self) -> dict[Any, int]:
        """Each key's earliest stored timer: its windows ending before it have fired.

        Timers are stored only with allowed lateness, where a window keeps one
        until its cleanup. A checkpoint is taken between elements, when every
        timer at or before the watermark has fired: a window that fired ends
        at or before the watermark, each stored timer is after it, and a window
        that has not fired holds a timer at its end (a session, at its own or
        an earlier part's). So a window fired iff it ends before its key's
        first stored timer, whatever the watermark the restore resumes at (a
        rescaled one is the old subtasks' minimum). From the timer service's
        queue, restored at open: reading the timers' state again doubled the
        operator's open (100 k keys: 2.0 -> 4.2 s of CPU).
        """
        service = self._timers
        assert isinstance(service, InternalTimerService)
        return service.first_event_timers()

    def _drop_fired(self, first_timer: int) -> None:
        """Drop the current key's windows that end before ``first_timer`` (they fired)."""
        contents = self._contents
        for window in list(contents.keys()):
            if window[1] - 1 < first_timer:
                contents.remove(window)

    def _arm_stored_windows(self) -> None:
        """With allowed lateness, give each stored window its timers for this lateness.

        A window that has not fired gets its end's and cleanup's timers (a
        checkpoint taken without allowed lateness stores none, see
        :meth:`_derive_timers`); one that fired and waits for its cleanup gets
        the cleanup's at its end plus *this* lateness (a savepoint taken with
        another lateness has its timer elsewhere: it fires, and cleans nothing).
        Timers already set are not set twice.
        """
        assert self.backend is not None
        timers = self._timers
        assert timers is not None
        lateness, has = self._lateness, timers.has_event_time_timer
        first = self._first_stored_timers()
        for key, max_ts in self._window_ends():
            if has(max_ts + lateness):  # the same lateness: its timers are set
                continue
            if key in first and max_ts < first[key]:  # fired (see _first_stored_timers)
                timers.register_event_time_timer(max_ts + lateness)
            else:
                self._set_timers(max_ts)
        self._kc.key = None

    def close(self) -> None:
        for fn in (self.spec.window_function, self.spec.function):
            if isinstance(fn, ProcessWindowFunction):
                fn.close()

    # -- records ------------------------------------------------------------------------

    def process_batch(self, batch: list[Any]) -> list[Any]:
        """Add each record to its windows (see :meth:`_add_batch`, :meth:`_add_tumbling`).

        The key selector, timestamp assigner and aggregate/reduce function run
        here (a failure is ``RecordFailed``, as in every record loop), and a
        late firing's window function, which handles its own: :meth:`_fire`.
        """
        out: list[Any] = []
        self._out.collect = out.append
        if self._tumbling is not None:
            return self._add_tumbling(batch, out, *self._tumbling)
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
        contents = self._contents
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
                        contents.put(window, fold(contents.get(window, _MISSING), rec))
                        self._after_add(window)
                        continue
                    kw = (key, window)
                    acc = folded.get(kw, _MISSING)
                    if acc is _MISSING:
                        kc.key = key
                        acc = contents.get(window, _MISSING)
                        if acc is _MISSING:
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
                contents.put(window, acc)
        return out

    def _add_tumbling(self, batch: list[Any], out: list[Any], size: int, offset: int) -> list[Any]:
        """:meth:`_add_batch` for tumbling windows: per record, a dict lookup and the fold.

        Why: a record of a tumbling window is in one window, whose start is
        arithmetic; the general loop paid a ``bounds()`` call, a window tuple
        and three calls to fold an aggregate per record (the operator alone
        spent ~4.7 us per record there, pv_count's whole job ~3). Here a record
        whose (key, window) the batch already holds costs the key selector,
        the timestamp, one ``(key, start)`` lookup and the user's ``add``; the
        first record of a (key, window) in the batch takes the checks of
        :meth:`_add_batch`, in the same order, so state, timers and output
        are the same. Contents go to the buffer (see the module), not the
        state; the state is read only for a window written at a flush.
        """
        kc = self._kc
        ks = self._key_selector
        tsf = self._ts
        contents, buffer, stored = self._contents, self._buffer, self._stored
        fold, fold_owned = self._fold, self._fold_owned
        add = self._aggregate.add if self.spec.kind is WindowKind.AGGREGATE else None
        lateness, watermark = self._lateness, self.watermark  # no timer fires in a batch
        folded: dict[tuple[Any, int], Any] = {}
        it = iter(batch)
        try:
            for rec in it:
                key = ks(rec)
                ts = tsf(rec)
                start = ts - (ts - offset + size) % size  # window_start, inlined
                kw = (key, start)
                acc = folded.get(kw, _MISSING)
                if acc is not _MISSING:  # most records: the batch holds their window
                    folded[kw] = fold_owned(acc, rec) if add is None else add(rec, acc)
                    continue
                max_ts = start + size - 1
                if max_ts + lateness <= watermark:
                    self._late(rec)
                    continue
                acc = buffer.get(kw, _MISSING)
                if acc is _MISSING and kw in stored:
                    kc.key = key
                    acc = contents.get((start, start + size), _MISSING)
                if max_ts <= watermark:  # due: fires now, with this record in it
                    kc.key = key
                    buffer[kw] = acc = fold(acc, rec)
                    self._fire_due(start, start + size, acc)
                    continue
                if acc is _MISSING:
                    kc.key = key
                    self._set_timers(max_ts)
                    folded[kw] = fold(acc, rec)
                else:
                    folded[kw] = fold(acc, rec) if add is None else add(rec, acc)
        except Exception as exc:  # what the records before it folded is kept below
            raise RecordFailed(self, batch, it, out) from exc
        finally:
            buffer.update(folded)
        return out

    def _fire_due(self, start: int, end: int, value: Any) -> None:
        """Fire a due window (a record came before its cleanup); keep its cleanup timer set."""
        self._fire(TimeWindow(start, end), value)
        timers = self._timers
        assert timers is not None
        timers.register_event_time_timer(end - 1 + self._lateness)

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        """Write the buffered tumbling windows to the map state: the snapshot holds them.

        Called before every snapshot (see ``StreamOperator``), so the state
        at the barrier is what writing each batch's windows made it.
        """
        buffer = self._buffer
        if not buffer:
            return
        assert self._tumbling is not None
        size, kc, put = self._tumbling[0], self._kc, self._contents.put
        current = kc.key
        for key, start in buffer:
            kc.key = key
            put((start, start + size), buffer[key, start])
        self._stored.update(buffer)
        self._buffer = {}
        kc.key = current

    def _late(self, record: Any) -> None:
        side = self.side_output
        if side is not None and self.spec.late_tag is not None:
            side.append((self.spec.late_tag, record))
        else:
            self.late_dropped += 1

    def _fold(self, current: Any, record: Any) -> Any:
        """Return a window's contents with ``record`` added (``_MISSING``: a new window)."""
        kind = self.spec.kind
        if kind is WindowKind.AGGREGATE:
            fn = self._aggregate
            return fn.add(record, fn.create_accumulator() if current is _MISSING else current)
        if kind is WindowKind.REDUCE:
            return record if current is _MISSING else self._reduce(current, record)
        # A new list each time: the state may still hold the old one for a snapshot.
        return [record] if current is _MISSING else [*current, record]

    def _first(self, record: Any) -> Any:
        """Return the contents of a new window holding ``record``."""
        return self._fold(_MISSING, record)

    def _fold_owned(self, current: Any, record: Any) -> Any:
        """Like :meth:`_fold`, for contents the batch owns: a list ``_fold`` made grows in place."""
        if self.spec.kind is WindowKind.PROCESS:
            current.append(record)
            return current
        return self._fold(current, record)

    def _after_add(self, window: tuple[int, int]) -> None:
        """Set the window's timers, or fire it now if its time has passed (late firing)."""
        max_ts = window[1] - 1
        if max_ts > self.watermark:
            self._set_timers(max_ts)
            return
        self._fire_due(window[0], window[1], self._contents.get(window))

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
        self._timers.advance_watermark(timestamp, self._on_timer)
        return out

    def restore_watermark(self, timestamp: int) -> None:
        assert self._timers is not None
        self.watermark = max(self.watermark, timestamp)
        self._timers.restore_watermark(timestamp)

    def _on_timer(self, timestamp: int, key: Any) -> None:
        if self._tumbling is not None:
            self._on_tumbling_timer(timestamp, key, self._tumbling[0])
            return
        contents = self._contents
        lateness = self._lateness
        for raw, value in list(contents.items()):
            window = TimeWindow(*raw)
            max_ts = window.end - 1
            if max_ts == timestamp:
                self._fire(window, value)
            if max_ts + lateness == timestamp:
                contents.remove(raw)

    def _on_tumbling_timer(self, timestamp: int, key: Any, size: int) -> None:
        """:meth:`_on_timer` for tumbling windows: the windows are found from the time.

        The window ending at ``timestamp`` fires, the one ending ``allowed
        lateness`` before it is dropped (the same window without lateness);
        from the buffer, or the state if it was written there.
        """
        buffer, stored = self._buffer, self._stored
        start = timestamp + 1 - size
        value = buffer.get((key, start), _MISSING)
        if value is _MISSING and (key, start) in stored:
            value = self._contents.get((start, start + size), _MISSING)
        if value is not _MISSING:
            self._fire(TimeWindow(start, start + size), value)
        start -= self._lateness
        buffer.pop((key, start), None)
        if (key, start) in stored:
            stored.discard((key, start))
            self._contents.remove((start, start + size))

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
    def timer_service(self) -> InternalTimerService | DerivedEventTimers | None:
        return self._timers
