"""Tumbling windows: contents buffered between barriers, and an inlined record path.

Tumbling windows (a plain :class:`TumblingEventTimeWindows`) keep the
contents changed since the last checkpoint in memory, ``(key, start) ->
contents``, and write them to the map state just before each snapshot
(:meth:`TumblingWindowBuffer.prepare_snapshot_pre_barrier`); a window that fires
before the next barrier never touches the state. Why: a record's window is
mostly still open at the next batch, and a state read and put per (key,
window) per batch cost the operator as much as the rest of its work (the
snapshot holds the same windows either way: those open at the barrier).
A buffer of more than :attr:`~TumblingWindowBuffer.max_held` windows is
written the same way after its batch (:meth:`TumblingWindowBuffer.end_batch`):
with checkpoints off no barrier comes, and long windows (a process window's
element lists) would otherwise all stay in memory until they fire. The
default bound (50,000) is past what most jobs keep open.

A process window already in the state is only appended to: each later write
adds the elements buffered since as a chunk, folded with the newest chunks
as in a log-structured merge (:mod:`~aiostream_ckpt.runtime.windowing.window_chunks`),
read once when the window fires. Why: re-reading and re-writing the whole list
made a record's cost grow with its window's length once the bound was passed,
and every barrier re-encoded each open window whole (10,000 process windows,
bound 2,000, ``bench.window_held``: ~100 elements each 123 CPU s, appended 29 s).
A checkpoint of the one-list layout restores as is (windows without chunks);
restored under another assigner or size, the chunks are folded into their
lists at open (:meth:`~AppendedWindows._merge_appends`), for the general path.

A record's window is found from its timestamp, and a timer's window from its
time (:meth:`TumblingWindowBuffer._add_tumbling`,
:meth:`TumblingWindowBuffer._on_tumbling_timer`). Why a module of its own:
this is a fast path over the general window operator
(:mod:`~aiostream_ckpt.runtime.windowing.window_base`), which any other assigner, or a
savepoint with another window size, takes instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiostream_ckpt.jobspec.graph import WindowKind, WindowSpec
from aiostream_ckpt.jobspec.windows import TimeWindow, TumblingEventTimeWindows
from aiostream_ckpt.runtime.operators import RecordFailed
from aiostream_ckpt.runtime.windowing.window_base import MISSING, WINDOW_CONTENTS
from aiostream_ckpt.runtime.windowing.window_chunks import WINDOW_APPENDS, AppendedWindows


class TumblingWindowBuffer(AppendedWindows):
    """The window operator's tumbling windows: the buffer, its flush and the fast paths.

    Every path falls back to :class:`WindowOperatorBase`'s when ``_tumbling``
    is ``None`` (another assigner, or restored windows of another size).
    """

    def __init__(self, uid: str, spec: WindowSpec, key_selector: Callable[[Any], Any]) -> None:
        super().__init__(uid, spec, key_selector)
        assigner = spec.assigner
        #: ``(size, offset)`` when every record is in one size-aligned window (tumbling)
        self._tumbling = (
            (assigner.size, assigner.offset)
            if isinstance(assigner, TumblingEventTimeWindows)
            and type(assigner).bounds is TumblingEventTimeWindows.bounds
            else None
        )
        #: tumbling: ``(key, start) -> contents`` of windows changed since the last flush
        self._buffer: dict[tuple[Any, int], Any] = {}
        #: names the operator when a key is refused (see ``_add_tumbling``)
        self._where = f"window {uid!r}"
        #: tumbling: ``(key, start)`` of the windows in the map state (written or restored)
        #: -> how many chunks were appended to each (process windows; else 0)
        self._stored: dict[tuple[Any, int], int] = {}

    def _index_stored(self) -> None:
        """Tumbling: note the windows restored in state; another size turns the fast path off.

        A savepoint taken with another window size holds windows that the
        tumbling path (which finds a window from its end) would not find:
        they take the general path, as every window of this instance then,
        with their appended chunks folded into their lists.
        """
        self._buffer = {}
        stored = self._stored = {}
        self._chunk_sizes = {}
        assert self.backend is not None
        kc, backend = self._kc, self.backend
        if self._tumbling is not None:
            size = self._tumbling[0]
            for key in list(backend.keys(WINDOW_CONTENTS)):
                kc.key = key
                for start, end in list(self._contents.keys()):
                    if end - start != size:
                        self._tumbling = None
                        stored.clear()
                        break
                    stored[key, start] = 0
                if self._tumbling is None:
                    break
        appends = self._appends
        if appends is not None and self._tumbling is None:
            self._merge_appends()
        elif appends is not None:
            for key in list(backend.keys(WINDOW_APPENDS)):
                kc.key = key
                for start, _end, n in list(appends.keys()):
                    stored[key, start] = max(n, stored.get((key, start), 0))
        kc.key = None

    # -- records ------------------------------------------------------------------------

    def process_batch(self, batch: list[Any]) -> list[Any]:
        """Tumbling windows take :meth:`_add_tumbling`; other windows the general path."""
        if self._tumbling is None:
            return super().process_batch(batch)
        out: list[Any] = []
        self._out.collect = out.append
        return self._add_tumbling(batch, out, *self._tumbling)

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
        state; the state is read only for an aggregate or reduced value
        written at a flush. A process window's buffered list (new elements
        only, once the window is stored) grows in place: no copy per batch,
        and no user function has it until the window is due, whose records
        copy it (a late firing's list stays as it was given). A window new to
        the buffer and the state has its key checked (``backend.check_key``,
        what a state does at a key's first access): the buffer reaches keyed
        state only at a flush, so a key that would read back as another type
        failed at the next checkpoint, far from its record (or never, if its
        window fired first). Per new window, not per record.
        """
        kc = self._kc
        ks = self._key_selector
        tsf = self._ts
        contents, buffer, stored = self._contents, self._buffer, self._stored
        fold, fold_owned = self._fold, self._fold_owned
        add = self._aggregate.add if self.spec.kind is WindowKind.AGGREGATE else None
        # what the batch adds to the buffer is checked at its end: a process window's
        # records (kept here), other windows' folded values
        added: list[Any] | None = [] if self.spec.kind is WindowKind.PROCESS else None
        appended = self._appends is not None  # process: a stored window's list is not read
        lateness, watermark = self._lateness, self.watermark  # no timer fires in a batch
        assert self.backend is not None
        check_key, where = self.backend.check_key, self._where
        folded: dict[tuple[Any, int], Any] = {}
        it = iter(batch)
        try:
            for rec in it:
                key = ks(rec)
                ts = tsf(rec)
                start = ts - (ts - offset + size) % size  # window_start, inlined
                kw = (key, start)
                acc = folded.get(kw, MISSING)
                if acc is not MISSING:  # most records: the batch holds their window
                    folded[kw] = fold_owned(acc, rec) if add is None else add(rec, acc)
                    if added is not None:
                        added.append(rec)
                    continue
                max_ts = start + size - 1
                if max_ts + lateness <= watermark:
                    self._late(rec)
                    continue
                if added is not None:
                    added.append(rec)
                acc = buffer.get(kw, MISSING)
                if acc is MISSING:
                    if kw not in stored:  # a new window: its key reaches state at a flush
                        check_key(key, where)
                    elif not appended:
                        kc.key = key
                        acc = contents.get((start, start + size), MISSING)
                if max_ts <= watermark:  # due: fires now, with this record in it
                    kc.key = key
                    buffer[kw] = acc = fold(acc, rec)
                    if added is None:
                        self._check_contents([acc])
                    if appended and kw in stored:
                        acc = self._contents_of(key, start, size)
                    self._fire_due(start, start + size, acc)
                    continue
                if acc is MISSING:
                    if kw not in stored:
                        kc.key = key
                        self._set_timers(max_ts)
                    folded[kw] = fold(acc, rec)
                else:
                    folded[kw] = fold_owned(acc, rec) if add is None else add(rec, acc)
        except Exception as exc:  # what the records before it folded is kept (and checked)
            buffer.update(folded)
            self._check_contents(list(folded.values()) if added is None else added)
            raise RecordFailed(self, batch, it, out) from exc
        buffer.update(folded)
        self._check_contents(list(folded.values()) if added is None else added)
        return out

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        """Write the buffered tumbling windows to the map state: the snapshot holds them.

        Called before every snapshot (see ``StreamOperator``), so the state
        at the barrier is what writing each batch's windows made it.
        """
        self._write_buffer()

    def end_batch(self) -> None:
        """Write a buffer that outgrew ``max_held`` to the map state (memory bound)."""
        if len(self._buffer) > self.max_held:
            self._write_buffer()
        super().end_batch()

    def _write_buffer(self) -> None:
        """Write each buffered window to the map state once (appended if stored); buffer none."""
        buffer = self._buffer
        if not buffer:
            return
        assert self._tumbling is not None
        size, kc, put, stored = self._tumbling[0], self._kc, self._contents.put, self._stored
        process = self._appends is not None
        current = kc.key
        for kw, value in buffer.items():
            key, start = kw
            kc.key = key
            n = stored.get(kw)
            if not process:
                put((start, start + size), value)
                stored[kw] = 0
            elif n is None:
                self._stored_list(kw, (start, start + size), value)
                stored[kw] = 0
            else:
                stored[kw] = self._append(kw, (start, start + size), value, n)
        self._buffer = {}
        kc.key = current

    def _contents_of(self, key: Any, start: int, size: int) -> Any:
        """Return ``key``'s window at ``start``: buffered, stored, or both (process windows).

        The key context is ``key``. A stored process window's elements are its
        list, its appended chunks in order, then the buffered ones.
        """
        kw = (key, start)
        value = self._buffer.get(kw, MISSING)
        n = self._stored.get(kw)
        if n is None:
            return value
        window = (start, start + size)
        if self._appends is None:  # a single value: the buffered one is the newest
            return self._contents.get(window, MISSING) if value is MISSING else value
        if not n and value is MISSING:
            return self._contents.get(window, [])
        elements = self._read_window(window, n)
        if value is not MISSING:
            elements.extend(value)
        return elements

    # -- time ---------------------------------------------------------------------------

    def _on_timer(self, timestamp: int, key: Any) -> int | None:
        if self._tumbling is None:
            return super()._on_timer(timestamp, key)
        self._on_tumbling_timer(timestamp, key, self._tumbling[0])
        return None

    def _on_tumbling_timer(self, timestamp: int, key: Any, size: int) -> None:
        """:meth:`_on_timer` for tumbling windows: the windows are found from the time.

        The window ending at ``timestamp`` fires, the one ending ``allowed
        lateness`` before it is dropped (the same window without lateness);
        from the buffer, or the state if it was written there.
        """
        stored, fired = self._stored, self._restored_fired
        start = timestamp + 1 - size
        if not (fired and (key, timestamp) in fired):
            value = self._contents_of(key, start, size)
            if value is not MISSING:
                self._fire(TimeWindow(start, start + size), value)
        start -= self._lateness
        self._buffer.pop((key, start), None)
        appended = stored.pop((key, start), None)
        if appended is not None:
            self._remove_chunks((key, start), (start, start + size), appended)
            fired.discard((key, start + size - 1))
