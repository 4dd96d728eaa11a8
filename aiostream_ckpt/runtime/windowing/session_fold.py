"""The two hot loops of session windows, in Python and (when built) in C.

:func:`fold_py` adds a batch's records to their key's one held session,
:func:`rearm_py` moves a firing run's timers that were set before their
session grew to the session's end; each stops at the first record or timer
that needs more (a state read, a new or late session, a callback) and
returns its index, so the operator does that one in Python and calls again.
The C versions in ``_session_speedups.c`` do the same steps on the same
objects, with the same results (``tests/unit/runtime/windowing/test_session_fold.py``
runs both on random input); they are used when the extension was built and
``AIOSTREAM_NO_EXTENSIONS`` is not set. Why: these loops are most of a
session window's CPU (``python -m bench.session_phases``), and in Python
each record pays ~40 bytecodes for a dict lookup, two compares and a tuple.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

#: ``(start, end, contents)`` of one session, held per key in a list.
Session = tuple[int, int, Any]


def fold_py(
    batch: list[Any],
    i: int,
    held: dict[Any, list[Session]],
    key_selector: Callable[[Any], Any],
    timestamp: Callable[[Any], Any],
    add: Callable[[Any, Any], Any] | None,
    gap: int,
    after: int,
    added: list[Any],
    failed: list[int],
) -> int:
    """Fold ``batch[i:]`` into held sessions until a record needs the operator.

    A record is folded when its key's sessions are held, are one session,
    and the record touches it (``start <= ts + gap`` and ``ts <= end``) while
    the session is not due (``end > after``): its bounds grow to take
    ``[ts, ts + gap)``, its accumulator becomes ``add(record, acc)`` (also
    appended to ``added``); ``add=None`` is :class:`CountAggregate`'s,
    ``acc + 1`` for an ``int`` (else the record is the operator's). Returns the
    index of the first record that is not folded (``len(batch)`` when all
    are); an error in a user function is raised after its record's index is
    appended to ``failed``.
    """
    n = len(batch)
    try:
        while i < n:
            rec = batch[i]
            key = key_selector(rec)
            ts = timestamp(rec)
            sessions = held.get(key)
            if sessions is None or len(sessions) != 1 or ts.__class__ is not int:
                return i
            start, end, acc = sessions[0]
            if not (ts <= end and end > after and start <= ts + gap):
                return i
            if ts < start:
                start = ts
            if ts + gap > end:
                end = ts + gap
            if add is not None:
                acc = add(rec, acc)
            elif acc.__class__ is int:
                acc += 1
            else:
                return i
            added.append(acc)
            sessions[0] = (start, end, acc)
            i += 1
    except BaseException:
        failed.append(i)
        raise
    return i


def rearm_py(
    run: list[tuple[int, Any]],
    i: int,
    armed: dict[Any, int],
    held: dict[Any, list[Session]],
    buckets: dict[int, list[tuple[int, Any]]],
    watermark: int,
    bits: int,
) -> int:
    """Skip ``run[i:]``'s dead timers, move those set before their session grew; stop at the rest.

    A timer ``(ts, key)`` is dead unless ``armed[key] == ts``. A live one
    whose key holds one session that ends later (``end - 1 > ts``) is moved
    there: ``armed[key]`` becomes ``end - 1`` and the pair joins its bucket
    (``buckets[(end - 1) >> bits]``) when that bucket exists and the time is
    after ``watermark``. Returns the index of the first live timer that needs
    the operator (it fires, or its new time needs :meth:`_push`).
    """
    n = len(run)
    while i < n:
        ts, key = run[i]
        if armed.get(key) == ts:
            sessions = held.get(key)
            if sessions is None or len(sessions) != 1:
                return i
            later = sessions[0][1] - 1
            if later <= ts or later <= watermark:
                return i
            bucket = buckets.get(later >> bits)
            if bucket is None:
                return i
            armed[key] = later
            bucket.append((later, key))
        i += 1
        n = len(run)
    return i


fold: Callable[..., int] = fold_py
rearm: Callable[..., int] = rearm_py
#: whether the C loops are in use
NATIVE = False
if not os.environ.get("AIOSTREAM_NO_EXTENSIONS"):
    try:
        from aiostream_ckpt.runtime.windowing import _session_speedups

        fold, rearm = _session_speedups.fold, _session_speedups.rearm
        NATIVE = True
    except ImportError:  # not built (a pure-Python install): the loops above
        pass
