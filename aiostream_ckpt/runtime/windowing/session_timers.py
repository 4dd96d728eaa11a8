"""Session windows' event-time timers: one per key, at its earliest open session's end.

Without allowed lateness a session window needs one timer, at its end; a key
has one or two open sessions, and the earliest of their ends is the only one
that can be due first. So :class:`SessionTimers` keeps one timer per key (a
time set for a key that already has an earlier one is a no-op: when the
earlier fires, the operator sets the next from its sessions), in the calendar
queue of :class:`~aiostream_ckpt.time.timers.DerivedEventTimers`. Why: a
session's timer fires early ~7 times per session on the bench's input (it
was set before the session grew); the timer loop re-arms a held session's at
its end itself, a dict read and an append, where the general queue paid its
set of pending ``(timestamp, key)`` pairs, the callback and a registration.
Timer phase of ``python -m bench.session_phases --events 1000000``: -11 %.

Like :class:`DerivedEventTimers` the timers are not in the checkpoint: the
operator sets them again from its restored sessions when it opens.
"""

from __future__ import annotations

from bisect import bisect_right
from operator import itemgetter
from typing import Any

from aiostream_ckpt.runtime.windowing.session_fold import rearm
from aiostream_ckpt.state.backend import KeyedStateBackend
from aiostream_ckpt.time.timers import BUCKET_BITS, DerivedEventTimers, TimerCallback

_TS = itemgetter(0)
_NONE: dict[Any, list[Any]] = {}


class SessionTimers(DerivedEventTimers):
    """One event-time timer per key, the earliest set; a calendar queue in memory.

    A bucket entry ``(timestamp, key)`` is live while ``_armed[key]`` is its
    timestamp (an earlier time set since, or the timer having fired, leaves it
    behind, skipped when its bucket comes due). The calendar, its order (time,
    then the order set) and a timer set while others fire are the base class's.
    """

    __slots__ = ("_armed", "_held")

    def __init__(self, backend: KeyedStateBackend) -> None:
        super().__init__(backend)
        #: each key's timer
        self._armed: dict[Any, int] = {}
        #: the operator's held sessions during an advance (see ``advance_watermark``)
        self._held = _NONE

    def register_event_time_timer(self, timestamp: int) -> None:
        """Set the current key's timer at ``timestamp``, unless it has one at or before it."""
        key = self._kc.key
        t = self._armed.get(key)
        if t is None or timestamp < t:
            self._armed[key] = timestamp
            self._push(timestamp, key)

    def has_event_time_timer(self, timestamp: int) -> bool:
        return self._armed.get(self._kc.key) == timestamp

    def _push(self, timestamp: int, key: Any) -> None:
        n = timestamp >> BUCKET_BITS
        run = self._run
        if run is not None and timestamp <= self.watermark and n <= self._run_bucket:
            # due in this advance, before the buckets still to come: into the firing run
            run.insert(bisect_right(run, timestamp, lo=self._pos + 1, key=_TS), (timestamp, key))
        else:
            self._add(n, (timestamp, key))

    def advance_watermark(
        self, watermark: int, on_timer: TimerCallback, held: dict[Any, list[Any]] | None = None
    ) -> None:
        """Fire every timer at or before ``watermark``, in time order.

        ``held``: the operator's held sessions (key -> ``[(start, end,
        contents), ...]``); a key's one held session that ends after its timer
        is re-armed at its end without the callback (see :meth:`_fire`).
        """
        self._held = held or _NONE
        try:
            super().advance_watermark(watermark, on_timer)
        finally:
            self._held = _NONE

    def _fire(self, run: list[tuple[int, Any]], n: int, on_timer: TimerCallback) -> None:
        """Fire ``run``'s live timers (bucket ``n``'s due ones, by time); it grows as they set some.

        Most timers that come due were set before their session grew: a key's
        one held session that ends later is re-armed at its end here; the rest
        go to the callback (it fires, or reads the sessions from state). A time
        the callback returns re-arms its key there, as registering it would.
        """
        armed, kc, buckets, held = self._armed, self._kc, self._buckets, self._held
        watermark = self.watermark
        self._run, self._run_bucket = run, n
        i = -1
        try:
            while True:
                # the dead and the simply moved, in C when built: see session_fold.rearm
                i = rearm(run, i + 1, armed, held, buckets, watermark, BUCKET_BITS)
                if i >= len(run):
                    break
                ts, key = run[i]
                if armed.get(key) != ts:
                    continue  # left behind: an earlier time was set since, or it fired
                sessions = held.get(key)
                if sessions is not None and len(sessions) == 1:
                    later = sessions[0][1] - 1
                    if later > ts:  # set before the session grew: its end's timer instead
                        armed[key] = later
                        self._pos = i
                        self._push(later, key)
                        continue
                del armed[key]
                self._pos = i
                kc.key = key
                later = on_timer(ts, key)
                if later is None:
                    continue
                t = armed.get(key)  # the callback may have set one
                if t is None or later < t:
                    armed[key] = later
                    self._push(later, key)
        except BaseException:
            self._run = None  # into their buckets, not the run given up
            for entry in run[i + 1 :]:  # not fired: pending again (the dead ones skipped)
                if armed.get(entry[1]) == entry[0]:
                    self._add(entry[0] >> BUCKET_BITS, entry)
            raise
        finally:
            self._run = None

    def pending(self) -> tuple[int, int]:
        """How many event-time timers are set (one per key at most), and no processing-time."""
        return len(self._armed), 0
