"""A stored process window as its list plus appended chunks, kept few by folding.

A process window written to keyed state more than once is appended to, as
Flink's ``ListState.add``: its list stays in :data:`WINDOW_CONTENTS`, ``(start,
end) -> elements``, and each later write adds the elements buffered since as
a chunk of its own to :data:`WINDOW_APPENDS`, ``(start, end, n) -> elements``,
n = 1, 2, ... in arrival order. A window's elements are its list, then its
chunks in order; they are read when the window fires. Why: re-reading and
re-writing the whole list made a record's cost grow with its window's length.

The chunks are folded as in a log-structured merge: a new chunk first takes
in the newest chunks while the one before them is at most 1.5 times what it
holds (:meth:`AppendedWindows._append`), the list too when that holds for it.
So each chunk is more than 1.5 times the next: a window of n elements has at
most log1.5(n) + 1 entries; and an element is rewritten only into a chunk at
least 5/3 of its old one: at most log5/3(n) times. Writes of equal size fold
as a binary counter (100 one-record writes: 3.8 writes per element, at most
6 entries). Why: a chunk per write made each element of a window that gets
one record between writes an LMDB entry of its own (10,000 windows of 100,
``bench.window_held``: working LMDB 29 -> 126 MB, peak RSS 131 -> 173 MB),
and folding every write into the list is the quadratic rewrite again; a
ratio of 2 bounds the entries a little tighter for ~30 % more writes.

The tumbling windows' buffer appends at its flush
(:mod:`~aiostream_ckpt.runtime.windowing.tumbling_windows`); the general path (sliding
windows, any other fixed assigner) at each batch's end, through the hooks of
:class:`~aiostream_ckpt.runtime.windowing.window_base.WindowOperatorBase`
(:meth:`AppendedWindows._fold_base`, ...). Why the general path too: it read
each window a batch touched and wrote its whole list back, so a record's cost
grew with its window (``bench.window_held --slide 4``, 2,000 keys, 4 windows
a record: 55 / 81 / 131 us a record at 25 / 50 / 100 elements a window; now
65 / 72 / 70). It keeps each window's chunk count in memory
(``_appended``); a restore folds chunks into their lists at open, as for a
tumbling savepoint of another size, so none is restored there.

The chunks' sizes are kept in memory for the windows written in this run;
a restored window's are read once, at its first append (a checkpoint of the
one-chunk-per-write layout is folded then). Chunks live under the window's
stream key, as its list, so snapshots, restore and rescale by key group keep
them together.
"""

from __future__ import annotations

from typing import Any

from aiostream_ckpt.runtime.windowing.window_base import (
    MISSING,
    WINDOW_CONTENTS,
    WindowOperatorBase,
)

#: The map state of the elements appended to process windows already in
#: :data:`WINDOW_CONTENTS`: ``(start, end, n) -> elements``, n = 1, 2, ... in arrival order.
WINDOW_APPENDS = "window-appends"


class AppendedWindows(WindowOperatorBase):
    """Process windows' appended chunks: append with folding, read, remove, merge at restore.

    Each method works on the current key's window; ``n`` is the window's
    number of chunks, ``ref`` the caller's name for the window (for its sizes).
    """

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        #: process windows: the :data:`WINDOW_APPENDS` map state (set at ``open``), else None
        self._appends: Any = None
        #: ``ref -> [list size, chunk 1 size, ..., chunk n size]``, for the windows stored
        #: in this run or appended to since the restore (else read at the next append)
        self._chunk_sizes: dict[Any, list[int]] = {}
        #: general path: ``(key, start, end) -> chunks`` of the windows appended to (n >= 1)
        self._appended: dict[tuple[Any, int, int], int] = {}
        #: general path, within a batch: ``(key, window)`` of the stored windows it appends to
        self._appending: set[tuple[Any, tuple[int, int]]] = set()

    def _stored_list(self, ref: Any, window: tuple[int, int], elements: list[Any]) -> None:
        """Put ``elements`` as the window's list (a window not in state before)."""
        self._contents.put(window, elements)
        self._chunk_sizes[ref] = [len(elements)]

    def _append(self, ref: Any, window: tuple[int, int], elements: list[Any], n: int) -> int:
        """Append ``elements`` to a stored window of ``n`` chunks; return its chunks now.

        The new chunk takes in the newest chunks (and the list) while the one
        before is at most 1.5 times what it holds: one write of what it took in.
        """
        sizes = self._chunk_sizes.get(ref)
        if sizes is None:
            sizes = self._chunk_sizes[ref] = self._read_sizes(window, n)
        total, i = len(elements), len(sizes)
        while i and 2 * sizes[i - 1] <= 3 * total:  # at most 1.5 times
            i -= 1
            total += sizes[i]
        start, end = window
        appends = self._appends
        if i == len(sizes):  # nothing to fold in: a chunk of its own, unread
            appends.put_unread((start, end, i), elements)
            sizes.append(total)
            return i
        folded = list(self._contents.get_unread(window, ())) if i == 0 else []
        for j in range(max(i, 1), len(sizes)):
            folded.extend(appends.get_unread((start, end, j)))
        folded.extend(elements)
        if i == 0:
            self._contents.put(window, folded)
        else:
            appends.put((start, end, i), folded)
        for j in range(i + 1, len(sizes)):
            appends.remove((start, end, j))
        del sizes[i + 1 :]
        sizes[i] = total
        return i

    def _read_sizes(self, window: tuple[int, int], n: int) -> list[int]:
        """Read the sizes of a restored window's list and chunks (once, at its first append)."""
        get = self._appends.get
        return [
            len(self._contents.get(window, ())),
            *(len(get((*window, j))) for j in range(1, n + 1)),
        ]

    def _read_window(self, window: tuple[int, int], n: int) -> list[Any]:
        """Return the window's elements: its list, then its ``n`` chunks in order (a new list)."""
        elements = list(self._contents.get(window, ()))
        get = self._appends.get
        for j in range(1, n + 1):
            elements.extend(get((*window, j)))
        return elements

    def _remove_chunks(self, ref: Any, window: tuple[int, int], n: int) -> None:
        """Remove the window's list and its ``n`` chunks from state."""
        self._contents.remove(window)
        self._chunk_sizes.pop(ref, None)
        for j in range(1, n + 1):
            self._appends.remove((*window, j))

    # -- the general path (any other assigner): hooks of WindowOperatorBase ----------------

    def _fold_base(self, key: Any, window: tuple[int, int]) -> Any:
        """Return ``[]`` for a stored process window: the batch's records become a chunk.

        A window written in this run is known stored from its chunk sizes: its
        list is not read (past the state cache, a read decoded the key's
        windows whole, per batch).
        """
        if self._appends is None:
            return self._contents.get(window, MISSING)
        kw = (key, window)
        if not self._is_stored(key, window):
            self._appending.discard(kw)
            return MISSING
        self._appending.add(kw)
        return []

    def _is_stored(self, key: Any, window: tuple[int, int]) -> bool:
        """Tell whether the current key's process window is in state (general path)."""
        if (key, *window) in self._chunk_sizes:
            return True
        return self._contents.get_unread(window, MISSING) is not MISSING

    def _write(self, key: Any, window: tuple[int, int], value: Any) -> None:
        """Append a stored process window's new elements; write other windows whole."""
        kw = (key, window)
        if self._appends is None:
            self._contents.put(window, value)
        elif kw in self._appending:
            self._appending.discard(kw)
            self._append_general((key, *window), window, value)
        else:
            self._stored_list((key, *window), window, value)

    def _append_general(
        self, ref: tuple[Any, int, int], window: tuple[int, int], elements: list[Any]
    ) -> int:
        """:meth:`_append` on the general path: each window's chunks are in ``_appended``."""
        n = self._append(ref, window, elements, self._appended.get(ref, 0))
        if n:
            self._appended[ref] = n
        else:
            self._appended.pop(ref, None)
        return n

    def _add_due(self, key: Any, window: tuple[int, int], record: Any) -> None:
        if self._appends is None or not self._is_stored(key, window):
            super()._add_due(key, window, record)
            return
        n = self._append_general((key, *window), window, [record])
        self._fire_due(window[0], window[1], self._read_window(window, n))

    def _whole(self, key: Any, window: tuple[int, int], stored: Any) -> Any:
        n = self._appended.get((key, *window)) if self._appended else None
        return self._read_window(window, n) if n else stored

    def _remove(self, key: Any, window: tuple[int, int]) -> None:
        ref = (key, *window)
        self._remove_chunks(ref, window, self._appended.pop(ref, 0))

    def _merge_appends(self) -> None:
        """Fold every appended chunk into its window's list: the general path reads one list."""
        assert self.backend is not None
        kc, contents, appends = self._kc, self._contents, self._appends
        for key in list(self.backend.keys(WINDOW_APPENDS)):
            kc.key = key
            merged: dict[tuple[int, int], list[Any]] = {}
            for (start, end, _n), chunk in sorted(appends.items()):
                window = (start, end)
                if window not in merged:
                    merged[window] = list(contents.get(window, ()))
                merged[window].extend(chunk)
            for window, elements in merged.items():
                contents.put(window, elements)
            appends.clear()
        self._chunk_sizes, self._appended = {}, {}


__all__ = ["WINDOW_APPENDS", "WINDOW_CONTENTS", "AppendedWindows"]
