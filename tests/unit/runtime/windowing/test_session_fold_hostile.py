"""Session windows' C loops against hostile input: user code that changes what they read.

The key selector, the timestamp assigner, an aggregate's ``add`` and a key's
``__hash__``/``__eq__`` run in the middle of the loops and may change the
batch, the held sessions, the armed times, the buckets or the run; numbers
may be huge, bools or subclasses. Each case runs the C loop and its Python
twin on fresh copies and wants the same outcome (or, for a number the C loop
does not do, a hand-back at that item). The memory-safety cases run in a
child ``python -X dev``, so a crash fails one test instead of the run.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from collections.abc import Callable
from operator import itemgetter
from typing import Any

import pytest

from aiostream_ckpt.jobspec.watermarks import MIN_WATERMARK
from aiostream_ckpt.runtime.windowing import session_fold
from aiostream_ckpt.runtime.windowing.session_fold import fold_py, rearm_py

if session_fold.NATIVE:
    from aiostream_ckpt.runtime.windowing._session_speedups import fold as fold_c
    from aiostream_ckpt.runtime.windowing._session_speedups import rearm as rearm_c

pytestmark = pytest.mark.skipif(
    not session_fold.NATIVE, reason="the C loops are not built (or AIOSTREAM_NO_EXTENSIONS)"
)

GAP = 100


class Boom(Exception):
    pass


def _outcome(call: Callable[[], int]) -> tuple[Any, ...]:
    try:
        return ("ok", call())
    except Exception as exc:  # the same type and message from both
        return ("raised", type(exc).__name__, str(exc))


class _Fold:
    """One fold case on fresh containers; ``hooks`` see them (``self``) and may change them."""

    def __init__(
        self,
        batch: list[Any],
        held: dict[Any, Any],
        start: int = 0,
        after: int = 0,
        gap: int = GAP,
        key_hook: Any = None,
        add_hook: Any = None,
        count: bool = False,
    ) -> None:
        self.batch = [dict(r) for r in batch]
        self.held = {k: list(v) for k, v in held.items()}
        self.start, self.after, self.gap, self.count = start, after, gap, count
        self.key_hook, self.add_hook = key_hook, add_hook
        self.added: list[Any] = []
        self.failed: list[int] = []
        self.calls: list[Any] = []

    def key(self, rec: dict[str, Any]) -> Any:
        self.calls.append(("key", rec["ts"]))
        return self.key_hook(self, rec) if self.key_hook else rec["k"]

    def add(self, rec: dict[str, Any], acc: Any) -> Any:
        self.calls.append(("add", rec["ts"]))
        if self.add_hook:
            self.add_hook(self, rec)
        return acc + 1

    def run(self, loop: Any) -> tuple[Any, ...]:
        got = _outcome(
            lambda: loop(
                self.batch,
                self.start,
                self.held,
                self.key,
                itemgetter("ts"),
                None if self.count else self.add,
                self.gap,
                self.after,
                self.added,
                self.failed,
            )
        )
        return got, self.batch, self.held, self.added, self.failed, self.calls


def _same_fold(**case: Any) -> tuple[Any, ...]:
    c, py = _Fold(**case).run(fold_c), _Fold(**case).run(fold_py)
    assert c == py
    return c


BATCH = [{"k": "a", "ts": 10}, {"k": "a", "ts": 20}, {"k": "a", "ts": 30}]
HELD = {"a": [(0, 100, 0)]}


@pytest.mark.parametrize("at", [10, 20, 30])
@pytest.mark.parametrize("where", ["key", "add"])
def test_a_user_function_that_raises_marks_its_record_failed(where: str, at: int) -> None:
    def boom(f: _Fold, rec: dict[str, Any]) -> Any:
        if rec["ts"] == at:
            raise Boom(at)
        return rec["k"]

    got = _same_fold(batch=BATCH, held=HELD, **{f"{where}_hook": boom})
    assert got[0] == ("raised", "Boom", str(at)) and got[4] == [at // 10 - 1]


def _clear_sessions(f: _Fold, rec: Any) -> None:
    f.held["a"].clear()


def _drop_key(f: _Fold, rec: Any) -> None:
    f.held.pop("a", None)


def _replace_sessions(f: _Fold, rec: Any) -> None:
    f.held["a"] = [(0, 5, 99)]


def _grow_sessions(f: _Fold, rec: Any) -> None:
    f.held["a"].append((500, 600, 1))


def _wreck_everything(f: _Fold, rec: Any) -> None:  # and make held resize
    f.batch.clear()
    f.held.clear()
    f.held.update({n: [(0, 1, 0)] for n in range(200)})


@pytest.mark.parametrize(
    "hook", [_clear_sessions, _drop_key, _replace_sessions, _grow_sessions, _wreck_everything]
)
def test_an_add_that_changes_the_held_sessions_or_the_batch(hook: Any) -> None:
    """``sessions[0] = ...`` goes to the list read before ``add``, as in Python."""
    _same_fold(batch=BATCH, held=HELD, add_hook=hook)


@pytest.mark.parametrize("change", ["grow", "shrink", "clear"])
def test_a_key_selector_that_changes_the_batch_length(change: str) -> None:
    """The length at the call bounds the loop; a shortened batch is an IndexError there.

    The C loop used to read the length anew each record: it folded records
    appended during the call and stopped quietly (no failed index) at a
    shortened batch's end, where Python raises for ``batch[i]``.
    """

    def key(f: _Fold, rec: dict[str, Any]) -> Any:
        if change == "grow" and len(f.batch) < 6:
            f.batch.append({"k": "a", "ts": 40})
        elif rec["ts"] == 20:
            del f.batch[1 if change == "shrink" else 0 :]
        return rec["k"]

    got = _same_fold(batch=BATCH, held=HELD, key_hook=key)
    assert got[0] == (("ok", 3) if change == "grow" else ("raised", "IndexError", got[0][2]))


@pytest.mark.parametrize("ts", [20, 20.0, 1 << 70, True])
def test_a_key_whose_hash_raises_fails_its_record_whatever_its_timestamp(ts: Any) -> None:
    """Python looks the key up before it checks the timestamp's type; the C loop now too."""

    class Unhashable:
        def __hash__(self) -> int:
            raise Boom("hash")

    def key(f: _Fold, rec: dict[str, Any]) -> Any:
        return Unhashable() if rec["k"] == "bad" else rec["k"]

    batch = [{"k": "a", "ts": 10}, {"k": "bad", "ts": ts}, {"k": "a", "ts": 30}]
    got = _same_fold(batch=batch, held=HELD, key_hook=key)
    assert got[0] == ("raised", "Boom", "hash") and got[4] == [1]


def test_the_c_fold_works_before_the_first_watermark() -> None:
    """``after`` is MIN_WATERMARK + 1 until a watermark comes: it was handed back, every record."""
    for count in (True, False):
        got = _same_fold(batch=BATCH, held=HELD, after=MIN_WATERMARK + 1, count=count)
        assert got[0] == ("ok", 3)
    # and a watermark past every end: nothing is folded (each session is due)
    assert _same_fold(batch=BATCH, held=HELD, after=1 << 70)[0] == ("ok", 0)


class _Sub(int):
    pass


class _SubTuple(tuple):  # type: ignore[type-arg]
    pass


@pytest.mark.parametrize(
    ("ts", "session", "gap"),
    [
        (True, (0, 100, 0), GAP),
        (_Sub(20), (0, 100, 0), GAP),
        (1 << 61, (0, 100, 0), GAP),
        (1 << 62, ((1 << 62) - 50, (1 << 62) + 1, 0), GAP),
        (20, (_Sub(0), 100, 0), GAP),
        (20, (False, 100, 0), GAP),
        (20, (0, 1 << 64, 0), GAP),
        (20, (0, 100, 1 << 61), GAP),
        (20, (0, 100, True), GAP),
        (20, (0, 100, _Sub(3)), GAP),
        (20, _SubTuple((0, 100, 0)), GAP),
        (20, (0, 100, 0), 1 << 62),
        (-(1 << 61), (-(1 << 61), -(1 << 61) + 5, 0), GAP),
    ],
)
def test_an_odd_number_is_handed_back_at_its_record(ts: Any, session: Any, gap: int) -> None:
    """The C loop folds what Python does up to the odd record, then that too or hands it back."""
    batch = [{"k": "a", "ts": 10}, {"k": "a", "ts": ts}]
    got_c = _Fold(batch, {"a": [session]}, count=True, gap=gap).run(fold_c)
    if got_c[0] != ("ok", 2):  # handed back: Python does the same up to there
        j = got_c[0][1]
        assert got_c[0] == ("ok", j) and j in (0, 1)
        batch = batch[:j]
    got_py = _Fold(batch, {"a": [session]}, count=True, gap=gap).run(fold_py)
    assert got_c[2:5] == got_py[2:5]  # held, added, failed


# -- rearm --------------------------------------------------------------------------------


class _K:
    """A key that collides with every other: each dict lookup calls ``__eq__`` (the hook)."""

    hook: Callable[[], None] | None = None

    def __init__(self, n: int) -> None:
        self.n = n

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        if _K.hook is not None:
            _K.hook()
        return isinstance(other, _K) and other.n == self.n

    def __repr__(self) -> str:
        return f"K{self.n}"


def _rearm_case(
    loop: Any, make_hook: Any, start: int = 0, watermark: int = 10, bits: int = 4
) -> tuple[Any, ...]:
    a, b = _K(1), _K(2)
    run: list[Any] = [(20, a), (20, b), (30, a)]
    armed: dict[Any, Any] = {a: 20, b: 20}
    held: dict[Any, Any] = {a: [(0, 60, 1)], b: [(0, 70, 1)]}
    buckets: dict[int, list[Any]] = {n: [] for n in range(10)}
    _K.hook = make_hook(run, armed, held, buckets) if make_hook else None
    try:
        got = _outcome(lambda: loop(run, start, armed, held, buckets, watermark, bits))
    finally:
        _K.hook = None

    # by key number: a dict cleared mid-insert is left inconsistent by CPython itself
    def n(k: Any) -> Any:
        return getattr(k, "n", k)

    return (
        got,
        [(t, n(k)) for t, k in run],
        sorted((n(k), v) for k, v in armed.items()),
        sorted((n(k), v) for k, v in held.items()),
        {b: [(t, n(k)) for t, k in v] for b, v in buckets.items()},
    )


def _at_call(j: int, action: str) -> Any:
    def make(
        run: list[Any], armed: dict[Any, Any], held: dict[Any, Any], buckets: dict[int, Any]
    ) -> Callable[[], None]:
        calls = [0]

        def hook() -> None:
            calls[0] += 1
            if calls[0] != j:
                return
            if action == "raise":
                raise Boom(j)
            if action == "clear":
                for d in (run, armed, held, buckets):
                    d.clear()
            elif action == "grow":
                run.extend([(20, _K(3))] * 5)
                held.update({n: [(0, 1, 0)] for n in range(100)})  # resizes
                armed.update(dict.fromkeys(range(100), 1))

        return hook

    return make


@pytest.mark.parametrize("j", range(1, 10))
@pytest.mark.parametrize("action", ["raise", "clear", "grow"])
def test_a_keys_eq_that_raises_or_changes_the_dicts_in_rearm(action: str, j: int) -> None:
    assert _rearm_case(rearm_c, _at_call(j, action)) == _rearm_case(rearm_py, _at_call(j, action))


def test_rearm_before_the_first_watermark_and_past_the_last() -> None:
    for watermark in (MIN_WATERMARK, 1 << 63):
        assert _rearm_case(rearm_c, None, watermark=watermark) == _rearm_case(
            rearm_py, None, watermark=watermark
        )


def _raise_boom() -> None:
    raise Boom


def test_the_error_paths_leave_no_reference_behind() -> None:
    """Each way out with an exception, 200 times: what the loops read keeps its refcount."""
    t0 = 10**12  # objects of their own (not immortal), so a leaked reference shows
    key = ("a", t0)
    ts = [t0 + d for d in (10, 20, 30)]
    session = (t0, t0 + 100, t0 * 3)
    batch = [{"k": key, "ts": t} for t in ts]

    def bad_hash(f: _Fold, rec: Any) -> Any:
        return [] if rec["ts"] == ts[1] else rec["k"]  # unhashable

    def shrink(f: _Fold, rec: Any) -> Any:
        del f.batch[1:]
        return rec["k"]

    def boom(f: _Fold, rec: Any) -> None:
        if rec["ts"] == ts[1]:
            raise Boom

    def clear(f: _Fold, rec: Any) -> None:
        f.held[key].clear()

    cases: list[dict[str, Any]] = [
        {"add_hook": boom},
        {"add_hook": clear},  # IndexError from sessions[0] = ...
        {"key_hook": bad_hash},
        {"key_hook": shrink},  # IndexError from batch[i]
    ]
    a, b = _K(1), _K(2)
    watched = [key, *ts, session, *session, a, b]
    before = [sys.getrefcount(o) for o in watched]
    for _ in range(200):
        for case in cases:
            assert _Fold(batch, {key: [session]}, gap=100, **case).run(fold_c)[0][0] == "raised"
        for run in [(20, a), (20, b)], [(20, b)]:  # Boom from the held, the armed lookup
            armed, held = {a: 20, b: 20}, {b: [(0, 60, 1)], a: [(0, 60, 1)]}
            _K.hook = _raise_boom
            try:
                with pytest.raises(Boom):
                    rearm_c(run, 0, armed, held, {3: []}, 10, 4)
            finally:
                _K.hook = None
    del run, armed, held
    gc.collect()
    assert [sys.getrefcount(o) for o in watched] == before


# -- memory safety, in a child process ----------------------------------------------------

_CHILD = """
import gc, weakref
from aiostream_ckpt.runtime.windowing._session_speedups import fold, rearm
from aiostream_ckpt.runtime.windowing.session_fold import fold_py, rearm_py
"""


def _child(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-X", "dev", "-c", _CHILD + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_negative_start_reads_from_the_end_as_python_does() -> None:
    """``batch[-2]``, not the memory before the list's items (it crashed)."""
    out = _child("""
        from operator import itemgetter
        for loop in (fold, fold_py):
            for start in (-2, -9):
                batch = [{"k": "a", "ts": t} for t in (10, 20, 30)]
                held, added, failed = {"a": [(0, 100, 0)]}, [], []
                try:
                    got = loop(batch, start, held, itemgetter("k"), itemgetter("ts"), None,
                               100, 0, added, failed)
                except IndexError as exc:
                    got = repr(exc)
                print(got, held, added, failed)
            run = [(20, "a"), (30, "b")]
            armed, buckets = {"a": 20, "b": 30}, {3: []}
            held = {"a": [(0, 60, 1)], "b": [(0, 9, 1)]}
            print((rearm if loop is fold else rearm_py)(run, -2, armed, held, buckets, 10, 4),
                  armed, buckets)
        """)
    lines = out.splitlines()
    assert len(lines) == 6 and lines[:3] == lines[3:], out


def test_rearm_holds_the_bucket_while_a_collection_may_drop_it() -> None:
    """A collection started by the new ``(time, key)`` tuple ran a finalizer that dropped the
    bucket; the C loop, holding it only borrowed, appended to a freed list (the key leaked,
    or a crash). Now it appends to the dropped list, as Python does, and nothing leaks."""
    out = _child("""
        class Garbage:  # in a cycle: only a collection frees it
            def __init__(self, buckets):
                self.buckets, self.me = buckets, self
            def __del__(self):
                self.buckets.clear()

        class K:
            armed = False
            def __init__(self, n, buckets):
                self.n, self.buckets = n, buckets
            def __hash__(self):
                return 7
            def __eq__(self, other):
                if K.armed:  # the held lookup: a collection due at the next GC allocation
                    K.armed = False
                    gc.disable()
                    K.keep = [(i, -i) for i in range(3000)]  # past the 2-tuples' free list
                    Garbage(self.buckets)
                    gc.enable()
                return self is other

        for loop in (rearm_py, rearm):
            buckets = {3: []}
            a, b = K(1, buckets), K(2, buckets)
            gone = weakref.ref(a)
            held = {b: [(0, 90, 1)], a: [(0, 60, 1)]}  # a's lookup compares it with b
            armed, run = {a: 20}, [(20, a)]
            K.armed = True
            print(loop(run, 0, armed, held, buckets, 10, 4), list(armed.values()), buckets)
            del a, b, held, armed, run, buckets, K.keep
            gc.collect()
            print("key freed:", gone() is None)
        """)
    lines = out.splitlines()
    assert lines == ["1 [59] {}", "key freed: True"] * 2, out
