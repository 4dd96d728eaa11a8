"""SourceTriggers: a source task's barriers and timer ticks, run between two reads, in order."""

from __future__ import annotations

import asyncio

from aiostream_ckpt.aio import Wakeup
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier
from aiostream_ckpt.runtime.source_triggers import SourceTriggers


def _recording(took: asyncio.Event | None = None) -> tuple[SourceTriggers, list[object]]:
    ran: list[object] = []

    async def checkpoint(barrier: CheckpointBarrier) -> None:
        ran.append(barrier.checkpoint_id)
        if took is not None:
            took.set()

    async def fire_timers() -> None:
        ran.append("timers")

    return SourceTriggers(checkpoint, fire_timers), ran


def test_run_takes_barriers_and_ticks_in_arrival_order() -> None:
    async def run() -> tuple[bool, list[object], bool]:
        triggers, ran = _recording()
        before = bool(triggers)
        triggers.trigger_checkpoint(CheckpointBarrier(1, 0))
        triggers.timers_due()
        triggers.trigger_checkpoint(CheckpointBarrier(2, 0))
        await triggers.run()
        return before, ran, bool(triggers)

    assert asyncio.run(run()) == (False, [1, "timers", 2], False)


def test_serve_until_runs_what_comes_until_done() -> None:
    async def run() -> list[object]:
        took = asyncio.Event()
        triggers, ran = _recording(took)
        done = asyncio.Event()
        serving = asyncio.create_task(triggers.serve_until(done))
        await asyncio.sleep(0)  # a scheduling point, not a wait for time: it is now idle
        triggers.trigger_checkpoint(CheckpointBarrier(3, 0))
        await took.wait()
        done.set()
        await serving
        return ran

    assert asyncio.run(run()) == [3]


def test_the_readers_wakeup_is_set_while_something_is_queued() -> None:
    """A paced reader's sleep ends when a barrier comes; it sleeps again once it was taken."""

    async def run() -> list[bool]:
        wakeup = Wakeup()
        triggers = SourceTriggers(_noop_checkpoint, _noop_timers, wakeup)
        seen = [wakeup.is_set()]
        triggers.trigger_checkpoint(CheckpointBarrier(1, 0))
        seen.append(wakeup.is_set())
        await triggers.run()
        seen.append(wakeup.is_set())
        triggers.timers_due()
        seen.append(wakeup.is_set())
        await triggers.run()
        return [*seen, wakeup.is_set()]

    assert asyncio.run(run()) == [False, True, False, True, False]


async def _noop_checkpoint(barrier: CheckpointBarrier) -> None:
    return None


async def _noop_timers() -> None:
    return None
