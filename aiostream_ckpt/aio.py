"""Asyncio plumbing shared by the components that own background work."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundTasks:
    """The background tasks of one component: none is created and forgotten.

    Every task is tracked until it ends; the first exception of any of them is
    handed to ``on_error`` (the owner decides: fail the job, fail the task);
    :meth:`cancel_all` cancels and awaits whatever is still running.
    """

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self._on_error = on_error
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._on_error(exc)

    async def cancel_all(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __len__(self) -> int:
        return len(self._tasks)


class FixedThreadPool(ThreadPoolExecutor):
    """A thread pool whose ``size`` threads all start with it and live until ``shutdown``.

    ``ThreadPoolExecutor`` starts a thread only when work arrives while every
    thread is busy, so a long-running job grew its pools at random moments
    (a checkpoint's writes overlapping for the first time after 16 minutes),
    each new thread a step in RSS (its stack and malloc arena). Starting them
    all at once puts that cost in the start-up; the owner shuts the pool down.
    """

    def __init__(self, size: int, name: str) -> None:
        super().__init__(max_workers=size, thread_name_prefix=name)
        # each thread takes one of these and waits for the others: ``size`` threads run
        started = threading.Barrier(size)
        for f in [self.submit(started.wait) for _ in range(size)]:
            f.result()


class Wakeup:
    """A flag that, once set, ends a :meth:`sleep` early (a paced reader's, for a barrier).

    Cheaper than racing the sleep against an ``asyncio.Event`` (:func:`unless_set`:
    two tasks and a wait per sleep, ~0.2 % of a core at 20 sleeps/s): one task
    per sleep, which :meth:`set` cancels.
    """

    __slots__ = ("_is_set", "_sleeper")

    def __init__(self) -> None:
        self._is_set = False
        self._sleeper: asyncio.Future[None] | None = None

    def is_set(self) -> bool:
        return self._is_set

    def set(self) -> None:
        self._is_set = True
        if self._sleeper is not None:
            self._sleeper.cancel()

    def clear(self) -> None:
        self._is_set = False

    async def sleep(self, sleep: Coroutine[Any, Any, None]) -> None:
        """Await ``sleep`` (one at a time) unless this is set first; at once if it is set."""
        if self._is_set:
            sleep.close()
            return
        sleeper = self._sleeper = asyncio.ensure_future(sleep)
        try:
            await sleeper
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not sleeper.cancelled() or (task is not None and task.cancelling()):
                raise  # the caller was cancelled, not woken
        finally:
            self._sleeper = None
            sleeper.cancel()


async def unless_set(aw: Awaitable[T], event: asyncio.Event) -> T | None:
    """Await ``aw`` unless ``event`` is set first: then cancel it and return ``None``."""
    fut = asyncio.ensure_future(aw)
    event_wait = asyncio.ensure_future(event.wait())
    done, _ = await asyncio.wait({fut, event_wait}, return_when=asyncio.FIRST_COMPLETED)
    if fut in done:
        event_wait.cancel()
        return fut.result()
    fut.cancel()
    await asyncio.gather(fut, return_exceptions=True)
    return None


async def unless_failed(main: Awaitable[T], failure: asyncio.Future[BaseException]) -> T:
    """Await ``main`` unless ``failure`` is set first: then cancel ``main``, raise the failure.

    ``main`` has ended when this returns or raises, also when the caller is
    cancelled: its cleanup must not race the caller's; and its error, if it
    failed in the step the caller was cancelled, is collected, not left for
    asyncio to log as never retrieved.
    """
    work = asyncio.ensure_future(main)
    try:
        watch: set[asyncio.Future[Any]] = {work, failure}
        done, _ = await asyncio.wait(watch, return_when=asyncio.FIRST_COMPLETED)
        if failure in done:
            raise failure.result()
        return work.result()
    finally:
        # a no-op if main is done, but it collects an error main ended with meanwhile
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)


async def to_the_end(work: asyncio.Future[None]) -> None:
    """Await file work in an executor thread; if cancelled, still wait for it to end.

    A thread cannot be stopped: returning at once would let the caller's
    cleanup race the file operations still running. Cancellation is re-raised;
    an error the work ended with meanwhile is collected (the caller is gone),
    not left for asyncio to log as never retrieved at a failover.
    """
    try:
        await asyncio.shield(work)
    except asyncio.CancelledError:
        await asyncio.wait([work])
        if not work.cancelled():
            work.exception()
        raise
