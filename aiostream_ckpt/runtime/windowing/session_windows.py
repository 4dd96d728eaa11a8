"""Session windows: a key's open sessions are one small list, held in memory between barriers.

Per key, one value state holds the key's open sessions, ``[(start, end,
contents), ...]`` (a key has one or two open at a time; a fired session
leaves it, so its size does not follow the key's history). The operator
holds the lists of the keys it touched since the last barrier in a plain
dict (:attr:`SessionWindowOperator._held`): a record, a merge or a firing
changes the held list, and the lists go into keyed state once, at the
pre-barrier flush (:meth:`~SessionWindowOperator.prepare_snapshot_pre_barrier`,
Flink's ``prepareSnapshotPreBarrier``), so every snapshot holds the sessions
as of its barrier. A key's first record after a barrier reads its list once;
every other record costs a dict lookup and a tuple, whatever the key's
history. Why: writing each touched key's list back after every batch cost a
state read, a write-set entry and a scan of the list per key and batch, and
with many keys most records are their key's only one in the batch: a read
and a write per record (the bench's 300 k clicks over 10 k users: the
record loop took 1.8 s of CPU, now 0.9 s). A dict of more than
:attr:`~SessionWindowOperator.max_held` keys (the state cache's bound) is
flushed after its batch, so memory stays bounded between barriers.

Timers are those of :class:`~aiostream_ckpt.runtime.windowing.window_operator.WindowOperator`:
a new session sets them at its ``max_timestamp`` (and its cleanup time after
the allowed lateness); a session that grows or merges keeps its parts'
timers, which fire no later than its own, and the first of them that fires
sets the session's current ones (:meth:`SessionWindowOperator._on_timer`). So
a growing session costs no timer work per click, and a key holds about one
timer per open session, whatever its history. Without allowed lateness the
timers are :class:`~aiostream_ckpt.runtime.windowing.session_timers.SessionTimers`: one
per key, at its earliest session's end, and a key's one held session whose
timer comes due early is re-armed at its end by the timer loop itself. A
session that fired has no timer before its cleanup: a late record that grows
it past the watermark sets its end's timers (it fires again there, as Flink's
merging trigger does).

Lateness, late firing and the late side output are the window operator's
(Flink's): a record whose session is late goes to the side output; one that
lands in a session whose time has passed but is not late yet fires it again
at once, with the record in it (the watermark does not move within a batch).

A checkpoint written before this layout (each session a ``window-contents``
map entry) is moved into it when the operator opens.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aiostream_ckpt.jobspec.graph import WindowKind
from aiostream_ckpt.jobspec.window_functions import CountAggregate
from aiostream_ckpt.jobspec.windows import EventTimeSessionWindows, TimeWindow
from aiostream_ckpt.runtime.operators import RecordFailed
from aiostream_ckpt.runtime.windowing.session_fold import fold
from aiostream_ckpt.runtime.windowing.session_timers import SessionTimers
from aiostream_ckpt.runtime.windowing.window_operator import WINDOW_CONTENTS, WindowOperator
from aiostream_ckpt.state.codecs import EXACT_SCALARS
from aiostream_ckpt.state.descriptors import ValueStateDescriptor

#: The value state of a key's open sessions: ``[(start, end, contents), ...]``.
SESSIONS = "session-windows"

Session = tuple[int, int, Any]


def _unchanging(sessions: list[Session]) -> bool:
    """Whether ``sessions`` holds only ints and scalar contents (nothing that can change)."""
    for start, end, contents in sessions:
        if not (
            start.__class__ is int and end.__class__ is int and contents.__class__ in EXACT_SCALARS
        ):
            return False
    return True


class SessionWindowOperator(WindowOperator):
    """The window operator for merging (session) window assigners."""

    contents_state = SESSIONS

    def _open_windows(self) -> None:
        assert self.backend is not None
        contents = Any if self.spec.state_type is None else self.spec.state_type
        stored: Any = list[tuple[int, int, contents]]  # type: ignore[valid-type]
        self._sessions = self.backend.create_state(
            ValueStateDescriptor(SESSIONS, stored, serializer=self.spec.serializer)
        )
        assigner = self.spec.assigner
        self._bounds = assigner.bounds
        #: the gap when a record's window is ``[ts, ts + gap)`` (the inlined path)
        self._gap = (
            assigner.gap
            if isinstance(assigner, EventTimeSessionWindows)
            and type(assigner).bounds is EventTimeSessionWindows.bounds
            else 0
        )
        #: sessions of the keys touched since the last flush; written to state at the next
        self._held: dict[Any, list[Session]] = {}
        #: what this batch put into held sessions (see ``contents_check``)
        self._added: list[Any] = []
        self._migrate()

    def _derived_timers(self) -> SessionTimers:
        assert self.backend is not None
        return SessionTimers(self.backend)

    def _advance_timers(self, timestamp: int) -> None:
        timers = self._timers
        if isinstance(timers, SessionTimers):
            timers.advance_watermark(timestamp, self._on_timer, self._held)
        else:
            super()._advance_timers(timestamp)

    def _migrate(self) -> None:
        """Move sessions a checkpoint of the map layout holds into the value state."""
        assert self.backend is not None
        kc, old = self._kc, self._contents
        for key in list(self.backend.keys(WINDOW_CONTENTS)):
            kc.key = key
            sessions = sorted((w[0], w[1], value) for w, value in old.items())
            self._sessions.update((self._sessions.value() or []) + sessions)
            old.clear()
        kc.key = None

    def _window_ends(self) -> Iterator[tuple[Any, int]]:
        assert self.backend is not None
        kc, state = self._kc, self._sessions
        for key in list(self.backend.keys(SESSIONS)):
            kc.key = key
            for s in state.value() or ():
                yield key, s[1] - 1

    def _drop_fired(self, first_timer: int) -> None:
        sessions = self._sessions.value() or []
        keep = [s for s in sessions if s[1] - 1 >= first_timer]
        if len(keep) != len(sessions):
            self._sessions.update(keep or None)

    def _drop_window(self, key: Any, max_ts: int) -> None:
        sessions = self._held.get(key)
        if sessions is None:
            sessions = self._sessions.value() or []
        self._held[key] = [s for s in sessions if s[1] - 1 != max_ts]

    def open_sessions(self, key: Any) -> list[tuple[int, int]]:
        """``key``'s open sessions as ``(start, end)``, oldest first (tests, inspection)."""
        self._kc.key = key
        sessions = self._held.get(key)
        if sessions is None:
            sessions = self._sessions.value() or []
        return sorted((s[0], s[1]) for s in sessions)

    def held_keys(self) -> int:
        """How many keys' sessions are held in memory, not yet in keyed state (tests)."""
        return len(self._held)

    # -- the flush ----------------------------------------------------------------------

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        """Write the held sessions into keyed state: the snapshot holds them as of the barrier."""
        super().prepare_snapshot_pre_barrier(checkpoint_id)  # the layers below: nothing held
        self._flush()

    def end_batch(self) -> None:
        if len(self._held) > self.max_held:
            self._flush()
        super().end_batch()

    def _flush(self) -> None:
        """Write each held key's sessions into keyed state once; hold none.

        A list written is never changed again (a key touched later gets a copy
        of it), so one of tuples of ints and scalar contents goes into the
        write set as it is, encoded at the snapshot: when every held list is
        such, all of them in one call (``update_all_unchanged``; a fired key's
        empty list clears it). Why: a key switch, a check and a call per key,
        10 k keys per barrier on the bench's input: 18.9 ms a barrier, 14.0
        ms in one call (the rest is the dict updates themselves).
        """
        held = self._held
        if not held:
            return
        self._held = {}
        kinds = {(s[0].__class__, s[1].__class__, s[2].__class__) for v in held.values() for s in v}
        if all(a is int and b is int and c in EXACT_SCALARS for a, b, c in kinds):
            values: dict[Any, list[Session] | None] = held  # type: ignore[assignment]
            for key in [key for key, sessions in held.items() if not sessions]:
                values[key] = None
            self._sessions.update_all_unchanged(values)
            return
        kc, state = self._kc, self._sessions
        current = kc.key
        for key, sessions in held.items():
            kc.key = key
            if not sessions:
                state.update(None)
            elif _unchanging(sessions):
                state.update_unchanged(sessions)
            else:
                state.update(sessions)
        kc.key = current

    # -- records ------------------------------------------------------------------------

    def process_batch(self, batch: list[Any]) -> list[Any]:
        """Add each record to its key's held sessions (read from state on a key's first).

        A failing record (key selector, timestamp, aggregate) is ``RecordFailed``;
        what the records before it did stays in the held lists, as it would in
        state. The common records of an aggregate, those that extend their key's
        one open session, are folded by :func:`~aiostream_ckpt.runtime.windowing.session_fold.fold`
        (in C when built); it stops at a record that needs more: a key's first
        (its sessions are read from state), one that opens a key's only session
        (folded here, as :meth:`_add` would), and the rest (:meth:`_add`).
        """
        out: list[Any] = []
        self._out.collect = out.append
        kc, ks, tsf = self._kc, self._key_selector, self._ts
        held = self._held
        value = self._sessions.value
        add, gap, set_timers = self._add, self._gap, self._set_timers
        agg = create = None
        if self.spec.kind is WindowKind.AGGREGATE and gap:
            agg, create = self._aggregate.add, self._aggregate.create_accumulator
        # fold counts itself (acc + 1) for the built-in count, not a subclass's add
        folds = None if type(self._aggregate) is CountAggregate else agg
        # what the batch puts into held sessions, checked at its end (they reach state later)
        added: list[Any] = []
        self._added = added
        after = self.watermark + 1  # a session ending after it is not due (no timer fires)
        n = len(batch)
        i = 0
        failed: list[int] = []  # fold's failing record
        try:
            while True:
                if agg is not None:
                    i = fold(batch, i, held, ks, tsf, folds, gap, after, added, failed)
                if i >= n:
                    break
                rec = batch[i]
                i += 1
                key = ks(rec)
                ts = tsf(rec)
                sessions = held.get(key)
                if sessions is None:
                    kc.key = key
                    sessions = held[key] = list(value() or ())
                    if agg is not None and len(sessions) == 1:
                        i -= 1  # its one session, now held: fold extends it (or hands it back)
                        continue
                if agg is not None and not sessions and ts + gap > after:
                    # a new session, not due: _add's way
                    assert create is not None
                    acc = agg(rec, create())
                    added.append(acc)
                    sessions.append((ts, ts + gap, acc))
                    kc.key = key
                    set_timers(ts + gap - 1)
                    continue
                kc.key = key
                if not add(sessions, rec, ts):
                    self._late(rec)
        except Exception as exc:
            self._check_contents(added)  # the records before it
            at = failed[0] if failed else i - 1
            raise RecordFailed(self, batch, iter(batch[at + 1 :]), out) from exc
        self._check_contents(added)
        return out

    def _add(self, sessions: list[Session], record: Any, ts: int) -> bool:
        """Add ``record`` to the session it starts or touches (merging those); False if late."""
        start, end = self._bounds(ts)[0]
        if len(sessions) == 1:  # a key's one open session: no list to build
            s = sessions[0]
            hits = [0] if s[0] <= end and start <= s[1] else []
        else:
            hits = [i for i, s in enumerate(sessions) if s[0] <= end and start <= s[1]]
        if len(hits) == 1:  # most records: they extend their key's open session
            i = hits[0]
            s = sessions[i]
            start, end = min(start, s[0]), max(end, s[1])
            sessions[i] = (start, end, self._added_to(self._fold_owned(s[2], record), record))
            if end - 1 <= self.watermark:
                self._fire_late(start, end, sessions[i][2])
            elif s[1] - 1 <= self.watermark:  # it fired, and now ends after the watermark
                self._set_timers(end - 1)
            return True
        max_ts = end - 1
        if not hits:
            if max_ts + self._lateness <= self.watermark:
                return False  # late: touched sessions would not be (they are cleaned up later)
            sessions.append((start, end, self._added_to(self._first(record), record)))
            if max_ts > self.watermark:
                self._set_timers(max_ts)
            else:
                self._fire_late(start, end, sessions[-1][2])
            return True
        parts = sorted(sessions[i] for i in hits)
        start, end = min(start, parts[0][0]), max(end, *(p[1] for p in parts))
        contents = self._added_to(
            self._fold_owned(self._merge_contents([p[2] for p in parts]), record), record
        )
        sessions[:] = [s for i, s in enumerate(sessions) if i not in hits]
        sessions.append((start, end, contents))
        if end - 1 <= self.watermark:
            self._fire_late(start, end, contents)
        elif all(p[1] - 1 <= self.watermark for p in parts):  # no part has a timer to come
            self._set_timers(end - 1)
        return True

    def _added_to(self, contents: Any, record: Any) -> Any:
        """Return ``contents``; note what the batch's check takes: the record or the value."""
        self._added.append(record if self.spec.kind is WindowKind.PROCESS else contents)
        return contents

    def _fire_late(self, start: int, end: int, contents: Any) -> None:
        """Fire a session whose time has passed again, now with a late record in it."""
        self._fire(TimeWindow(start, end), contents)
        if self._lateness:
            timers = self._timers
            assert timers is not None
            timers.register_event_time_timer(end - 1 + self._lateness)

    def _fire(self, window: TimeWindow, value: Any) -> None:
        # a session's element list grows in place: the window function gets its own copy
        super()._fire(window, list(value) if self.spec.kind is WindowKind.PROCESS else value)

    def _merge_contents(self, values: list[Any]) -> Any:
        kind = self.spec.kind
        acc = values[0]
        for v in values[1:]:
            if kind is WindowKind.AGGREGATE:
                acc = self._aggregate.merge(acc, v)
            elif kind is WindowKind.REDUCE:
                acc = self._reduce(acc, v)
            else:
                acc = [*acc, *v]
        return acc

    # -- time ---------------------------------------------------------------------------

    def _on_timer(self, timestamp: int, key: Any) -> int | None:
        """Fire the session due at ``timestamp``, drop the one cleaned up, re-arm the rest.

        The timer may be one a session's part set before it grew: then nothing
        is due, and the session gets the timers of its current end instead (a
        key's one session: returned, re-armed by the timer loop without a
        registration call, ~5 per session on the bench's input). A
        key's sessions come from the held dict, or from state (read only,
        copied into the dict when a session fires or leaves).
        """
        sessions = self._held.get(key)
        if sessions is None:
            sessions = self._sessions.value() or []
        lateness = self._lateness
        if len(sessions) == 1 and not lateness:  # most timers: a key's one session
            s = sessions[0]
            max_ts = s[1] - 1
            if max_ts > timestamp:  # set before the session grew: re-arm at its end
                return max_ts
            if max_ts == timestamp:
                self._held[key] = []
                self._fire(TimeWindow(s[0], s[1]), s[2])
            return None
        timers = self._timers
        assert timers is not None
        keep: list[Session] = []
        fired = self._restored_fired
        for s in sessions:
            max_ts = s[1] - 1
            if max_ts == timestamp and not (fired and (key, max_ts) in fired):
                self._fire(TimeWindow(s[0], s[1]), s[2])
            if max_ts + lateness != timestamp:
                keep.append(s)
            elif fired:
                fired.discard((key, max_ts))
        for s in keep:
            max_ts = s[1] - 1
            for t in (max_ts, max_ts + lateness) if lateness else (max_ts,):
                if t > timestamp and not timers.has_event_time_timer(t):
                    timers.register_event_time_timer(t)
        if len(keep) != len(sessions):
            self._held[key] = keep
        return None
