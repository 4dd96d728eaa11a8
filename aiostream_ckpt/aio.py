"""Asyncio plumbing shared by the components that own background work."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


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
