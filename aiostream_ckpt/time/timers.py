"""Keyed timers kept in keyed state, with in-memory queues rebuilt on restore.

Each timer is one entry of a map state per key (timestamp -> 0), so timers are
in every checkpoint and savepoint like any other keyed state and follow their
key group when the parallelism changes. The priority queues (a heap per time
domain plus the set of live ``(timestamp, key)`` pairs) are a derived index:
rebuilt in :meth:`InternalTimerService.open` from ``backend.keys()``. Deleting
a timer drops it from the set and the state; its heap entry is skipped when
it surfaces, and the heap is rebuilt once such entries outnumber the live ones.

Processing-time timers wake the task through a :class:`ProcessingTimeScheduler`
on the injected clock. The scheduler does not fire them itself: it enqueues a
tick that the task handles between elements, so a timer never fires between
a snapshot and its barrier.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Coroutine
from operator import itemgetter
from typing import Any

from aiostream_ckpt.clock import Clock
from aiostream_ckpt.jobspec.watermarks import MIN_WATERMARK
from aiostream_ckpt.state.backend import KeyedStateBackend
from aiostream_ckpt.state.descriptors import MapStateDescriptor

#: ``on_timer(timestamp, key)``; the key context is already set to ``key``. A returned
#: timestamp is a timer of the same time domain for ``key`` to set (as registering it).
TimerCallback = Callable[[int, Any], "int | None"]

#: Dead heap entries tolerated on top of twice the live ones before a rebuild.
_COMPACT_SLACK = 1024

EVENT_TIMERS = "_timers.event"
PROCESSING_TIMERS = "_timers.proc"


def now_millis(clock: Clock) -> int:
    return round(clock.time() * 1000)


class ProcessingTimeScheduler:
    """Wakes one task when its earliest processing-time timer is due.

    ``spawn`` is the task's way to run a background coroutine it owns (so its
    failure fails the task); ``wake`` puts a tick into the task's inbox.
    """

    def __init__(
        self,
        clock: Clock,
        spawn: Callable[[Coroutine[Any, Any, None], str], object],
        wake: Callable[[], Awaitable[None]],
        name: str,
    ) -> None:
        self.clock = clock
        self._spawn = spawn
        self._wake = wake
        self._name = name
        self._due: int | None = None
        self._generation = 0

    def schedule(self, due_ms: int) -> None:
        """Make sure the task is woken at ``due_ms`` (or earlier)."""
        if self._due is not None and self._due <= due_ms:
            return
        self._due = due_ms
        self._generation += 1
        self._spawn(self._sleep(due_ms, self._generation), f"{self._name}-ptimer")

    async def _sleep(self, due_ms: int, generation: int) -> None:
        delay = (due_ms - now_millis(self.clock)) / 1000
        if delay > 0:
            await self.clock.sleep(delay)
        if generation != self._generation:
            return  # an earlier deadline replaced this one
        self._due = None
        await self._wake()


class _Queue:
    """One time domain: state, heap and live set."""

    __slots__ = ("heap", "live", "state")

    def __init__(self, state: Any) -> None:
        self.state = state
        self.heap: list[tuple[int, int, Any]] = []
        self.live: set[tuple[int, Any]] = set()

    def compact(self) -> None:
        """Rebuild the heap once deleted timers outnumber the live ones.

        A deleted timer's heap entry is otherwise dropped only when it
        surfaces, so a key that keeps moving a timer ahead of the watermark
        (a growing session) would grow the heap with every move.
        """
        heap, live = self.heap, self.live
        if len(heap) > 2 * len(live) + _COMPACT_SLACK:
            heap[:] = [e for e in heap if (e[0], e[2]) in live]
            heapq.heapify(heap)

    def head(self) -> int | None:
        heap, live = self.heap, self.live
        while heap and (heap[0][0], heap[0][2]) not in live:
            heapq.heappop(heap)
        return heap[0][0] if heap else None


class InternalTimerService:
    """Timers of one keyed operator instance; the user sees it as a ``TimerService``.

    Timer time stamps are milliseconds: event time is compared with the
    watermark, processing time with the clock's wall time.
    """

    def __init__(self, backend: KeyedStateBackend) -> None:
        self._backend = backend
        self._kc = backend.key_context
        self._seq = itertools.count()
        self._event = _Queue(backend.create_state(MapStateDescriptor(EVENT_TIMERS)))
        self._proc = _Queue(backend.create_state(MapStateDescriptor(PROCESSING_TIMERS)))
        self._clock: Clock | None = None
        self._scheduler: ProcessingTimeScheduler | None = None
        self.watermark = MIN_WATERMARK

    def bind(self, scheduler: ProcessingTimeScheduler) -> None:
        """Attach the task's clock and wake-up (before the first record)."""
        self._scheduler = scheduler
        self._clock = scheduler.clock

    def open(self) -> None:
        """Rebuild the queues from restored state (after restore, before records)."""
        kc = self._kc
        for name, queue in ((EVENT_TIMERS, self._event), (PROCESSING_TIMERS, self._proc)):
            for key in list(self._backend.keys(name)):
                kc.key = key
                for ts in list(queue.state.keys()):
                    self._push(queue, int(ts), key)
        kc.key = None
        self._reschedule()

    def _push(self, queue: _Queue, ts: int, key: Any) -> bool:
        entry = (ts, key)
        if entry in queue.live:
            return False
        queue.live.add(entry)
        heapq.heappush(queue.heap, (ts, next(self._seq), key))
        return True

    # -- the user's TimerService -----------------------------------------------------

    def register_event_time_timer(self, timestamp: int) -> None:
        self._register(self._event, timestamp)

    def register_processing_time_timer(self, timestamp: int) -> None:
        if self._register(self._proc, timestamp):
            self._reschedule()

    def _register(self, queue: _Queue, timestamp: int) -> bool:
        """Store a new timer of the current key, then queue it; False if it was set.

        The state first: its put refuses a key that would read back as another
        type (see ``KeyedStateBackend.check_key``), and a timer queued before
        that fired in this run, under the key the checkpoint could not hold.
        """
        key = self._kc.key
        entry = (timestamp, key)
        live = queue.live
        if entry in live:
            return False
        queue.state.put(timestamp, 0)
        live.add(entry)
        heapq.heappush(queue.heap, (timestamp, next(self._seq), key))
        return True

    def has_event_time_timer(self, timestamp: int) -> bool:
        """Whether the current key has an event-time timer set at ``timestamp``."""
        return (timestamp, self._kc.key) in self._event.live

    def first_event_timers(self) -> dict[Any, int]:
        """Each key's earliest event-time timer, from memory (a restore's window bookkeeping)."""
        first: dict[Any, int] = {}
        for ts, key in self._event.live:
            if key not in first or ts < first[key]:
                first[key] = ts
        return first

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._delete(self._event, timestamp)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._delete(self._proc, timestamp)

    def _delete(self, queue: _Queue, timestamp: int) -> None:
        entry = (timestamp, self._kc.key)
        if entry in queue.live:
            queue.live.discard(entry)
            queue.state.remove(timestamp)
            queue.compact()

    def current_watermark(self) -> int:
        return self.watermark

    def current_processing_time(self) -> int:
        if self._clock is None:
            raise RuntimeError("the timer service is not bound to a task's clock yet")
        return now_millis(self._clock)

    # -- firing ------------------------------------------------------------------------

    def advance_watermark(self, watermark: int, on_timer: TimerCallback) -> None:
        """Fire every event-time timer at or before ``watermark``, in time order."""
        if watermark > self.watermark:
            self.watermark = watermark
        self._fire(self._event, watermark, on_timer)

    def restore_watermark(self, watermark: int) -> None:
        """Take ``watermark`` (restored from a checkpoint) as current without firing."""
        self.watermark = max(self.watermark, watermark)

    def advance_processing_time(self, now_ms: int, on_timer: TimerCallback) -> None:
        """Fire every processing-time timer due at ``now_ms``; re-arm for the next."""
        self._fire(self._proc, now_ms, on_timer)
        self._reschedule()

    def _fire(self, queue: _Queue, until: int, on_timer: TimerCallback) -> None:
        heap, live, state, kc = queue.heap, queue.live, queue.state, self._kc
        while heap and heap[0][0] <= until:
            ts, _, key = heapq.heappop(heap)
            entry = (ts, key)
            if entry not in live:
                continue  # deleted, or a duplicate of a fired one
            live.discard(entry)
            kc.key = key
            state.remove(ts)
            later = on_timer(ts, key)
            if later is not None and self._push(queue, later, key):  # re-armed, same domain
                state.put(later, 0)

    def _reschedule(self) -> None:
        if self._scheduler is None:
            return
        head = self._proc.head()
        if head is not None:
            self._scheduler.schedule(head)

    def pending(self) -> tuple[int, int]:
        """How many event-time and processing-time timers are set (tests, metrics)."""
        return len(self._event.live), len(self._proc.live)


#: A :class:`DerivedEventTimers` bucket holds the timers of one ``timestamp >> BUCKET_BITS``.
BUCKET_BITS = 10
_TS = itemgetter(0)


class DerivedEventTimers:
    """Event-time timers in memory only, for an operator that derives them from its state.

    The subset of :class:`InternalTimerService` a window operator uses. Not
    in the checkpoint: the operator registers them again from its restored
    state when it opens (session windows: each open session's end). Why:
    timers in keyed state cost a map put and a remove per timer and their
    LMDB records at every checkpoint, for information the state already has.

    A calendar queue: a timer is appended to the bucket of its ~1 s of event
    time (:data:`BUCKET_BITS`); a watermark sorts the buckets it reaches
    (stably, so equal times fire in the order they were set, as from a heap
    with a sequence number) and fires the timers at or before it in time
    order. Why: session windows set a timer again each time one fires early
    (its session grew since), ~5 per session, and a heap of every open
    session's timer paid ~25 tuple comparisons per pop, ~1 us; here a timer
    costs an append and its share of sorting a mostly sorted bucket, whatever
    the number of timers pending. A timer set while others fire, at or before
    the watermark, joins them at its time's place, as it would a heap.
    """

    __slots__ = ("_buckets", "_ids", "_kc", "_live", "_pos", "_run", "_run_bucket", "watermark")

    def __init__(self, backend: KeyedStateBackend) -> None:
        self._kc = backend.key_context
        self._buckets: dict[int, list[tuple[int, Any]]] = {}
        self._ids: list[int] = []  # heap of the bucket numbers in ``_buckets``
        self._live: set[tuple[int, Any]] = set()
        #: the timers firing now, by time, the bucket they came from and the one firing
        self._run: list[tuple[int, Any]] | None = None
        self._run_bucket = 0
        self._pos = 0
        self.watermark = MIN_WATERMARK

    def register_event_time_timer(self, timestamp: int) -> None:
        entry = (timestamp, self._kc.key)
        live = self._live
        if entry in live:
            return
        live.add(entry)
        n = timestamp >> BUCKET_BITS
        run = self._run
        if run is not None and timestamp <= self.watermark and n <= self._run_bucket:
            # due in this advance, before the buckets still to come: into the firing run
            run.insert(bisect_right(run, timestamp, lo=self._pos + 1, key=_TS), entry)
            return
        bucket = self._buckets.get(n)  # _add, inlined: a timer set again per session's click
        if bucket is None:
            self._buckets[n] = [entry]
            heapq.heappush(self._ids, n)
        else:
            bucket.append(entry)

    def _add(self, n: int, entry: tuple[int, Any]) -> None:
        bucket = self._buckets.get(n)
        if bucket is None:
            self._buckets[n] = [entry]
            heapq.heappush(self._ids, n)
        else:
            bucket.append(entry)

    def has_event_time_timer(self, timestamp: int) -> bool:
        return (timestamp, self._kc.key) in self._live

    def advance_watermark(self, watermark: int, on_timer: TimerCallback) -> None:
        """Fire every timer at or before ``watermark``, in time order (as the service does)."""
        if watermark > self.watermark:
            self.watermark = watermark
        ids, buckets = self._ids, self._buckets
        while ids and ids[0] << BUCKET_BITS <= watermark:
            n = ids[0]
            bucket = buckets[n]
            bucket.sort(key=_TS)
            if ((n + 1) << BUCKET_BITS) - 1 <= watermark:
                cut = len(bucket)
            else:  # the watermark is inside the bucket: its later timers stay
                cut = bisect_right(bucket, watermark, key=_TS)
                if not cut:
                    return
            if cut == len(bucket):
                run = bucket
                del buckets[n]
                heapq.heappop(ids)
            else:
                run, buckets[n] = bucket[:cut], bucket[cut:]
            self._fire(run, n, on_timer)

    def _fire(self, run: list[tuple[int, Any]], n: int, on_timer: TimerCallback) -> None:
        """Fire ``run`` (bucket ``n``'s due timers, by time); it grows if a timer sets one due.

        The loop sees what is inserted after the firing timer (a list iterator
        goes by index); ``_pos`` tells ``register_event_time_timer`` where that is.
        A callback that returns a time re-arms its key's timer there, as if it
        had registered it: a stale session timer (its session grew) is set
        again without a registration call (~0.33 per click on the bench's input).
        """
        live, kc = self._live, self._kc
        self._run, self._run_bucket = run, n
        i = -1
        try:
            for i, (ts, key) in enumerate(run):
                self._pos = i
                live.discard((ts, key))
                kc.key = key
                later = on_timer(ts, key)
                if later is None:
                    continue
                # re-armed by the callback: register_event_time_timer's work, for its key
                entry = (later, key)
                if later <= self.watermark:  # due in this advance: into the run
                    kc.key = key
                    self.register_event_time_timer(later)
                elif entry not in live:
                    live.add(entry)
                    self._add(later >> BUCKET_BITS, entry)
        except BaseException:
            for entry in run[i + 1 :]:  # not fired: pending again, as in a heap
                self._add(entry[0] >> BUCKET_BITS, entry)
            raise
        finally:
            self._run = None

    def restore_watermark(self, watermark: int) -> None:
        self.watermark = max(self.watermark, watermark)

    def pending(self) -> tuple[int, int]:
        return len(self._live), 0
