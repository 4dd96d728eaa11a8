"""aio.unless_set / unless_failed: what a task waits on while it may be told to stop."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from aiostream_ckpt.aio import to_the_end, unless_failed, unless_set


def test_result_when_the_awaitable_finishes_first() -> None:
    async def run() -> int | None:
        return await unless_set(asyncio.sleep(0, result=7), asyncio.Event())

    assert asyncio.run(run()) == 7


def test_none_and_the_awaitable_cancelled_when_the_event_is_set_first() -> None:
    async def run() -> tuple[object, bool]:
        done = asyncio.Event()
        never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        done.set()
        got = await unless_set(never, done)
        return got, never.cancelled()

    assert asyncio.run(run()) == (None, True)


def test_unless_failed_returns_what_main_returns() -> None:
    async def run() -> int:
        failure: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        return await unless_failed(asyncio.sleep(0, result=7), failure)

    assert asyncio.run(run()) == 7


def test_unless_failed_cancels_main_and_raises_the_failure() -> None:
    async def run() -> bool:
        failure: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        main: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        failure.set_result(RuntimeError("commit failed"))
        with pytest.raises(RuntimeError, match="commit failed"):
            await unless_failed(main, failure)
        return main.cancelled()

    assert asyncio.run(run()) is True


def test_unless_failed_ends_main_before_its_caller_sees_the_cancellation() -> None:
    async def run() -> list[str]:
        failure: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        events: list[str] = []
        started = asyncio.Event()

        async def main() -> None:
            try:
                started.set()
                await asyncio.get_running_loop().create_future()
            finally:
                events.append("main ended")

        async def caller() -> None:
            try:
                await unless_failed(main(), failure)
            finally:
                events.append("caller cleans up")

        task = asyncio.create_task(caller())
        await started.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return events

    assert asyncio.run(run()) == ["main ended", "caller cleans up"]


def test_unless_failed_collects_main_failing_in_the_step_its_caller_is_cancelled() -> None:
    async def run() -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        unretrieved: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, ctx: unretrieved.append(ctx))
        failure: asyncio.Future[BaseException] = loop.create_future()
        callers: list[asyncio.Task[None]] = []

        async def main() -> None:
            callers[0].cancel()
            raise RuntimeError("the peer process is gone")

        callers.append(asyncio.create_task(unless_failed(main(), failure)))
        await asyncio.gather(*callers, return_exceptions=True)
        callers.clear()
        gc.collect()  # an exception never retrieved is reported when its task is collected
        return unretrieved

    assert asyncio.run(run()) == []


def test_to_the_end_collects_the_work_failing_after_its_caller_was_cancelled() -> None:
    """A retention pass failing (a worker died mid-question) while the coordinator stops."""

    async def run() -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        unretrieved: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, ctx: unretrieved.append(ctx))
        work: asyncio.Future[None] = loop.create_future()
        caller = asyncio.create_task(to_the_end(work))
        await asyncio.sleep(0)
        caller.cancel()
        await asyncio.sleep(0)
        work.set_exception(RuntimeError("a worker did not say its pinned files"))
        with pytest.raises(asyncio.CancelledError):
            await caller
        del work, caller
        gc.collect()
        return unretrieved

    assert asyncio.run(run()) == []
