"""aio.unless_set: what a task waits on while it may be told it is done."""

from __future__ import annotations

import asyncio

from aiostream_ckpt.aio import unless_set


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
