"""The input gate's queue: a bound, a priority lane, and what a priority element overtook."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier
from aiostream_ckpt.runtime.channels import ChannelQueue, InputGate
from aiostream_ckpt.runtime.elements import Watermark

BARRIER = CheckpointBarrier(3, 0.0, unaligned=True)


async def test_priority_elements_go_first_and_never_wait_for_room() -> None:
    q = ChannelQueue(2)
    q.put_nowait((0, [1]))
    q.put_nowait((1, [2]))
    assert q.full()
    with pytest.raises(asyncio.QueueFull):
        q.put_nowait((0, [3]))
    q.put_priority((1, BARRIER))
    assert q.qsize() == 3 and q.has_priority
    assert q.get_nowait() == (1, BARRIER)
    assert [q.get_nowait(), q.get_nowait()] == [(0, [1]), (1, [2])]
    with pytest.raises(asyncio.QueueEmpty):
        q.get_nowait()


async def test_a_waiting_getter_and_putter_are_woken() -> None:
    q = ChannelQueue(1)
    getter = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    q.put_priority((0, BARRIER))
    assert await getter == (0, BARRIER)
    await q.put((0, [1]))
    putter = asyncio.ensure_future(q.put((0, [2])))
    await asyncio.sleep(0)
    assert not putter.done()
    assert q.get_nowait() == (0, [1])
    await putter
    assert q.get_nowait() == (0, [2])
    arrival = q.priority_arrival()
    assert not arrival.done()
    q.put_priority((0, BARRIER))
    assert arrival.done() and q.priority_arrival().done()


async def test_in_line_is_what_the_barrier_overtook_when_it_came_not_what_came_after() -> None:
    gate = InputGate(2, 8)
    waiting: deque[tuple[int, object]] = deque([(1, [5])])  # a remote channel's, not yet in
    gate.attach_pending(1, waiting)
    gate.queue.put_nowait((0, [1]))
    gate.queue.put_nowait((1, [2]))
    gate.queue.put_nowait((0, Watermark(4)))
    gate.queue.put_priority((1, BARRIER), waiting=len(waiting))
    waiting.append((1, [6]))  # after the barrier: not in flight
    gate.queue.put_priority((0, BARRIER))
    gate.queue.put_nowait((0, [7]))  # after the barrier: not in flight
    assert gate.queue.get_nowait() == (1, BARRIER)
    assert gate.in_line(1, 3, ahead=[(1, [0]), (0, [9])]) == ([[0], [2], [5]], None)
    assert gate.queue.get_nowait() == (0, BARRIER)
    assert gate.in_line(0, 3) == ([[1], Watermark(4)], None)
    # no priority element of channel 0 now: all of it up to a barrier in line
    gate.queue.put_nowait((0, CheckpointBarrier(4, 0.0)))
    gate.queue.put_nowait((0, [8]))
    assert gate.in_line(0, 4) == ([[1], Watermark(4), [7]], CheckpointBarrier(4, 0.0))
    # an older barrier in line belongs to no channel state
    assert gate.in_line(0, 5) == ([[1], Watermark(4), [7], [8]], None)


async def test_prioritize_moves_a_checkpoints_barriers_ahead_with_what_they_overtook() -> None:
    gate = InputGate(2, 8)
    announced: list[CheckpointBarrier] = []
    gate.queue.on_announce = announced.append
    barrier = CheckpointBarrier(6, 0.0, timeoutable=True)
    w0, w1 = gate.writer(0), gate.writer(1)
    await w0.send([1])
    await w1.send([2])
    await w0.send_barrier(barrier)  # in line, announced: the task times it
    await w0.send([3])  # after the barrier
    assert announced == [barrier] and not gate.queue.has_priority
    gate.queue.prioritize(6)
    assert gate.queue.get_nowait() == (0, barrier.as_unaligned())
    assert gate.in_line(0, 6) == ([[1]], None)  # [3] came after it
    await w1.send_barrier(barrier)  # comes later: straight into the lane
    assert gate.queue.get_nowait() == (1, barrier.as_unaligned())
    assert gate.in_line(1, 6) == ([[2]], None)
    assert [gate.queue.get_nowait()[1] for _ in range(3)] == [[1], [2], [3]]
