"""The window operator: keyed windows in keyed state, and their timers restored at open.

:class:`WindowOperator` is the operator the runtime builds for fixed windows
(and the base of :class:`~aiostream_ckpt.runtime.windowing.session_windows.SessionWindowOperator`),
in three layers, a module each: the contents, timers, firing, lateness and
the general record path (:mod:`~aiostream_ckpt.runtime.windowing.window_base`); the
tumbling windows' buffer between barriers and their inlined paths
(:mod:`~aiostream_ckpt.runtime.windowing.tumbling_windows`); and here, opening: the
window state and the timers a checkpoint or a savepoint leaves.

Timers: with allowed lateness they are the operator's
:class:`InternalTimerService` (keyed state too); without, the windows in
state are exactly the unfired ones, so the timers are kept in memory and
derived from them when the operator opens (:meth:`WindowOperator._derive_timers`).
A restore with another allowed lateness (savepoint) fires no window twice: a
window that fired and waits for its cleanup is cleaned up at its end plus the
new lateness (at once without lateness, or when that is at or before the
restored watermark), re-emitted only on a late record, never by a timer at
its end (a lowered lateness may put another window's cleanup there).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aiostream_ckpt.jobspec.functions import RuntimeContext
from aiostream_ckpt.jobspec.graph import WindowKind
from aiostream_ckpt.jobspec.window_functions import ProcessWindowFunction
from aiostream_ckpt.runtime.windowing.session_timers import SessionTimers
from aiostream_ckpt.runtime.windowing.tumbling_windows import TumblingWindowBuffer
from aiostream_ckpt.runtime.windowing.window_base import MAX_HELD, WINDOW_CONTENTS
from aiostream_ckpt.runtime.windowing.window_chunks import WINDOW_APPENDS
from aiostream_ckpt.state.descriptors import MapStateDescriptor
from aiostream_ckpt.time.timers import (
    EVENT_TIMERS,
    DerivedEventTimers,
    InternalTimerService,
)

__all__ = ["WINDOW_APPENDS", "WINDOW_CONTENTS", "WindowOperator"]


class WindowOperator(TumblingWindowBuffer):
    """The window operator for fixed (non-merging) window assigners."""

    def open(self, ctx: RuntimeContext) -> None:
        assert self.backend is not None
        self._kc = self.backend.key_context
        self.max_held = min(MAX_HELD, self.backend.cache_max_entries)
        self._contents = self.backend.create_state(
            MapStateDescriptor(
                WINDOW_CONTENTS, None, self.spec.state_type, serializer=self.spec.serializer
            )
        )
        self._appends = (
            self.backend.create_state(
                MapStateDescriptor(
                    WINDOW_APPENDS, None, self.spec.state_type, serializer=self.spec.serializer
                )
            )
            if self.spec.kind is WindowKind.PROCESS and not self.spec.assigner.merging
            else None
        )
        self._restored_fired = set()
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
        timers = self._timers = self._derived_timers()
        for _key, max_ts in self._window_ends():
            timers.register_event_time_timer(max_ts)
        kc.key = None

    def _derived_timers(self) -> DerivedEventTimers | SessionTimers:
        """Return the in-memory timers of windows without allowed lateness (sessions: their own)."""
        assert self.backend is not None
        return DerivedEventTimers(self.backend)

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
        """Drop the current key's windows that end before ``first_timer`` (they fired).

        And their appended chunks, whose map keys ``(start, end, n)`` end the same way.
        """
        for state in (self._contents, self._appends):
            for window in [] if state is None else list(state.keys()):
                if window[1] - 1 < first_timer:
                    state.remove(window)

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
        fired = self._restored_fired
        for key, max_ts in self._window_ends():
            if key in first and max_ts < first[key]:  # fired (see _first_stored_timers)
                fired.add((key, max_ts))
                timers.register_event_time_timer(max_ts + lateness)  # unless set
            elif not has(max_ts + lateness):  # the same lateness: its timers are set
                self._set_timers(max_ts)
        self._kc.key = None

    def _clean_up_restored(self) -> None:
        """Clean up now the restored fired windows whose cleanup the restored watermark passed.

        Their cleanup timers (a lowered lateness) are at or before the
        watermark: without this a record touching such a session merged into
        it and fired it again until the next watermark, where it is late (it
        was cleaned up in the run that lowered nothing); and a timer at or
        before the watermark stayed in the next checkpoint, against the rule
        of :meth:`_first_stored_timers`.
        """
        timers = self._timers
        assert isinstance(timers, InternalTimerService)
        kc, lateness, watermark = self._kc, self._lateness, self.watermark
        current = kc.key
        for key, max_ts in [e for e in self._restored_fired if e[1] + lateness <= watermark]:
            kc.key = key
            self._drop_window(key, max_ts)
            timers.delete_event_time_timer(max_ts + lateness)
            self._restored_fired.discard((key, max_ts))
        kc.key = current

    def _drop_window(self, key: Any, max_ts: int) -> None:
        """Drop ``key``'s window ending at ``max_ts`` (the key context is set to ``key``)."""
        for window in list(self._contents.keys()):
            if window[1] - 1 == max_ts:
                if self._tumbling is None:
                    self._remove(key, window)
                else:
                    appended = self._stored.pop((key, window[0]), 0)
                    self._remove_chunks((key, window[0]), window, appended)
                    self._buffer.pop((key, window[0]), None)
