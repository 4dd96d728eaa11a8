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
element lists) would otherwise all stay in memory until they fire. It trades
CPU for memory when more windows than that are busy at once: each batch then
reads its windows back from the state and writes them again (1 M events over
1,000 count windows, a bound of 500: 2.9 -> 10.1 CPU s; 10,000 process windows
of ~100 elements, bound 2,000: peak RSS 419 -> 302 MB, 10.5 -> 182 CPU s, a
list costing its length per read and write). The default bound (50,000) is
past what most jobs keep open.

A record's window is found from its timestamp, and a timer's window from its
time (:meth:`TumblingWindowBuffer._add_tumbling`,
:meth:`TumblingWindowBuffer._on_tumbling_timer`). Why a module of its own:
this is a fast path over the general window operator
(:mod:`~aiostream_ckpt.runtime.window_base`), which any other assigner, or a
savepoint with another window size, takes instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiostream_ckpt.jobspec.graph import WindowKind, WindowSpec
from aiostream_ckpt.jobspec.windows import TimeWindow, TumblingEventTimeWindows
from aiostream_ckpt.runtime.operators import RecordFailed
from aiostream_ckpt.runtime.window_base import MISSING, WINDOW_CONTENTS, WindowOperatorBase


class TumblingWindowBuffer(WindowOperatorBase):
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
        #: tumbling: the ``(key, start)`` windows that are in the map state (written or restored)
        self._stored: set[tuple[Any, int]] = set()

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
        state; the state is read only for a window written at a flush.
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
        lateness, watermark = self._lateness, self.watermark  # no timer fires in a batch
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
                if acc is MISSING and kw in stored:
                    kc.key = key
                    acc = contents.get((start, start + size), MISSING)
                if max_ts <= watermark:  # due: fires now, with this record in it
                    kc.key = key
                    buffer[kw] = acc = fold(acc, rec)
                    if added is None:
                        self._check_contents([acc])
                    self._fire_due(start, start + size, acc)
                    continue
                if acc is MISSING:
                    kc.key = key
                    self._set_timers(max_ts)
                    folded[kw] = fold(acc, rec)
                else:
                    folded[kw] = fold(acc, rec) if add is None else add(rec, acc)
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
        """Put each buffered window into the map state once; buffer none."""
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
        buffer, stored, fired = self._buffer, self._stored, self._restored_fired
        start = timestamp + 1 - size
        value = buffer.get((key, start), MISSING)
        if value is MISSING and (key, start) in stored:
            value = self._contents.get((start, start + size), MISSING)
        if value is not MISSING and not (fired and (key, timestamp) in fired):
            self._fire(TimeWindow(start, start + size), value)
        start -= self._lateness
        buffer.pop((key, start), None)
        if (key, start) in stored:
            stored.discard((key, start))
            self._contents.remove((start, start + size))
            fired.discard((key, start + size - 1))
