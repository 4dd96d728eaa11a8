"""Channels between processes (here: both ends of a socket pair in one loop).

What is checked: elements arrive in order with barriers in band, on their
channel index; a receiver that stops taking suspends the sender on its last
credit; an end of the connection that is not a goodbye fails it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvloop

from aiostream_ckpt.checkpoint.barriers import CancelCheckpoint, CheckpointBarrier, CheckpointKind
from aiostream_ckpt.errors import ChannelError, ChannelRecordError
from aiostream_ckpt.jobspec.watermarks import MAX_WATERMARK, MIN_WATERMARK
from aiostream_ckpt.runtime.channels import InputGate
from aiostream_ckpt.runtime.elements import (
    END_OF_INPUT,
    IDLE,
    Watermark,
)
from aiostream_ckpt.runtime.network.remote import (
    ChannelConnection,
    ConnectionState,
    RemoteChannelWriter,
    RemoteInput,
)
from aiostream_ckpt.runtime.partitioners import KeyGroupGate
from aiostream_ckpt.runtime.wire import batch_codec


@dataclasses.dataclass(frozen=True)
class Click:
    app_id: str
    at: datetime.datetime
    path: tuple[str, ...]


async def pair(
    *, window: int = 4, codec: Any = None
) -> tuple[ChannelConnection, ChannelConnection, socket.socket, socket.socket]:
    a_sock, b_sock = socket.socketpair()
    codec = codec or batch_codec()
    return (
        ChannelConnection("a->b", codec, window=window),
        ChannelConnection("b->a", codec, window=window),
        a_sock,
        b_sock,
    )


@dataclasses.dataclass
class Link:
    """One channel a -> b (channel 0, gate index 0), both connections started."""

    a: ChannelConnection
    b: ChannelConnection
    writer: RemoteChannelWriter
    reader: RemoteInput
    gate: InputGate


async def one_channel(
    closing: list[ChannelConnection], *, window: int = 4, capacity: int = 4, codec: Any = None
) -> Link:
    a, b, sa, sb = await pair(window=window, codec=codec)
    closing += [a, b]
    gate = InputGate(num_channels=1, capacity=capacity)
    link = Link(a, b, a.writer(0), b.reader(0, gate, index=0), gate)
    await a.start(sa)
    await b.start(sb)
    return link


@pytest.fixture
async def closing() -> AsyncIterator[list[ChannelConnection]]:
    conns: list[ChannelConnection] = []
    yield conns
    for c in conns:
        await c.close()


async def until(cond: Any, what: str) -> None:
    """Let the loop run until ``cond()`` holds (bounded by steps, never by time)."""
    for _ in range(10_000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


async def test_elements_arrive_in_order_with_barriers_in_band(
    closing: list[ChannelConnection],
) -> None:
    a, b, sa, sb = await pair()
    closing += [a, b]
    gate = InputGate(num_channels=3, capacity=64)
    w = a.writer(7)
    b.reader(7, gate, index=2)
    await a.start(sa)
    await b.start(sb)
    barrier = CheckpointBarrier(3, 1.5, CheckpointKind.SAVEPOINT)
    sent: list[Any] = [
        [{"k": "x", "n": 1}],
        Watermark(MIN_WATERMARK),
        [{"k": "y", "n": 2}, {"k": "z", "n": [1.5, None, True]}],
        barrier,
        IDLE,
        CancelCheckpoint(3),
        [{"k": "w", "n": 3}],
        Watermark(MAX_WATERMARK),
        END_OF_INPUT,
    ]
    for element in sent:
        await w.send(element)
    got = [await gate.queue.get() for _ in sent]
    assert got == [(2, e) for e in sent]
    assert got[3][1] == barrier and got[3][1].kind is CheckpointKind.SAVEPOINT


async def test_many_channels_share_one_connection_both_ways(
    closing: list[ChannelConnection],
) -> None:
    a, b, sa, sb = await pair(window=2)
    closing += [a, b]
    gate_b = InputGate(num_channels=2, capacity=2)
    gate_a = InputGate(num_channels=1, capacity=2)
    writers = [a.writer(0), a.writer(1)]
    b.reader(0, gate_b, index=0)
    b.reader(1, gate_b, index=1)
    back = b.writer(5)
    a.reader(5, gate_a, index=0)
    await a.start(sa)
    await b.start(sb)
    gate = KeyGroupGate(writers, lambda r: r["k"], max_parallelism=128)
    records = [{"k": f"key-{i % 37}", "i": i} for i in range(2_000)]

    async def produce() -> None:
        for i in range(0, len(records), 50):
            await gate.emit(records[i : i + 50])
        await gate.broadcast_control(END_OF_INPUT)

    producer = asyncio.create_task(produce())
    got: dict[int, list[Any]] = {0: [], 1: []}
    ended: set[int] = set()
    while len(ended) < 2:
        channel, element = await gate_b.queue.get()
        if element is END_OF_INPUT:
            ended.add(channel)
        else:
            got[channel].extend(element)
            if back.credits:  # the other direction, same connection; a takes nothing
                await back.send([len(element)])
    await producer
    for channel in (0, 1):
        assert got[channel] == [r for r in records if gate.route(r["k"]) == channel]
    # a never took from its gate: b's writer stopped on its credits, the records stayed apart
    await until(lambda: gate_a.queue.full(), "b's first sends reach a's gate")
    assert back.credits == 0 and [gate_a.queue.get_nowait()[0] for _ in range(2)] == [0, 0]


async def test_a_stopped_receiver_suspends_the_sender_on_its_last_credit(
    closing: list[ChannelConnection],
) -> None:
    window, capacity = 3, 2
    link = await one_channel(closing, window=window, capacity=capacity)
    w, r, gate = link.writer, link.reader, link.gate
    sent = 0

    async def produce() -> None:
        nonlocal sent
        while True:
            await w.send([{"n": sent}])
            sent += 1

    producer = asyncio.create_task(produce())
    try:
        # nobody takes from the gate: it fills, then the credits run out
        await until(
            lambda: w.suspended and len(r.pending) == window, "the sender waits for a credit"
        )
        assert w.credits == 0
        assert sent == capacity + window  # in the gate + held by the receiver
        assert gate.queue.full() and len(r.pending) == window
        for _ in range(100):
            await asyncio.sleep(0)
        assert sent == capacity + window and w.suspended  # still suspended: no credit came
        # the consumer takes one: one credit comes back, one more element goes
        assert (await gate.queue.get())[1] == [{"n": 0}]
        await until(lambda: sent == capacity + window + 1, "one more element after one credit")
        await until(lambda: w.suspended, "suspended again")
        # taking everything lets it run on, in order
        seen = [(await gate.queue.get())[1][0]["n"] for _ in range(20)]
        assert seen == list(range(1, 21))
        assert w.suspensions >= 2
    finally:
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)


async def test_eof_without_goodbye_fails_the_connection_and_the_sender(
    closing: list[ChannelConnection],
) -> None:
    link = await one_channel(closing, window=1, capacity=1)
    a, b, w = link.a, link.b, link.writer
    await w.send([1])
    await w.send([2])  # one in the gate, one held: no credit left
    send = asyncio.create_task(w.send([3]))
    await until(lambda: w.suspended, "the sender waits")
    b._transport.abort()  # type: ignore[union-attr]  # b's process dies: no goodbye
    with pytest.raises(ChannelError, match="peer process is gone"):
        await send
    exc = await a.failure
    assert isinstance(exc, ChannelError) and exc.retriable
    assert a.state is ConnectionState.FAILED
    with pytest.raises(ChannelError, match="peer process is gone"):
        await w.send([4])


async def test_goodbye_then_eof_is_an_orderly_close(closing: list[ChannelConnection]) -> None:
    link = await one_channel(closing)
    a, b, w, gate = link.a, link.b, link.writer, link.gate
    await w.send([1])
    await w.send(END_OF_INPUT)
    await a.close()
    await until(lambda: b.state is ConnectionState.CLOSED, "b sees the goodbye and the EOF")
    assert not b.failure.done()
    assert [await gate.queue.get() for _ in range(2)] == [(0, [1]), (0, END_OF_INPUT)]


async def test_a_record_json_would_change_is_refused_at_the_sender(
    closing: list[ChannelConnection],
) -> None:
    w = (await one_channel(closing)).writer
    with pytest.raises(
        ChannelRecordError, match=r"record 1 of the batch: record\['k'\] is a tuple"
    ):
        await w.send([{"k": "ok"}, {"k": ("a", 1)}])
    with pytest.raises(ChannelRecordError, match="float that is not finite"):
        await w.send([{"x": float("nan")}])
    with pytest.raises(ChannelRecordError, match="is a datetime"):
        await w.send([datetime.datetime(2026, 1, 1)])
    assert w.credits == 4  # nothing was sent: no credit spent
    assert not ChannelRecordError("x").retriable


async def test_declared_record_type_and_pickle_carry_what_json_cannot(
    closing: list[ChannelConnection],
) -> None:
    click = Click("app-1", datetime.datetime(2026, 11, 23, 16, 0), ("home", "cart"))
    for codec in (batch_codec("json", Click), batch_codec("pickle")):
        link = await one_channel(closing, codec=codec)
        await link.writer.send([click, click])
        (_, got) = await link.gate.queue.get()
        assert got == [click, click] and type(got[0]) is Click, codec.name
    with pytest.raises(ChannelError, match="unknown channel serializer"):
        batch_codec("yaml")


async def test_a_frame_for_an_undeclared_channel_fails_the_receiver(
    closing: list[ChannelConnection],
) -> None:
    a, b, sa, sb = await pair()
    closing += [a, b]
    w = a.writer(9)  # b declares no channel 9
    await a.start(sa)
    await b.start(sb)
    await w.send([1])
    exc = await b.failure
    assert isinstance(exc, ChannelError) and "undeclared channel 9" in str(exc)


def test_credits_flow_under_uvloop() -> None:
    """uvloop delivers a socket's first data before ``start`` resumes: credits must flow."""

    async def run() -> list[Any]:
        a, b, sa, sb = await pair(window=2)
        gate = InputGate(1, 1)
        w = a.writer(0)
        b.reader(0, gate, index=0)
        await a.start(sa)
        await w.send([0])
        await w.send([1])  # waiting in b's socket when b starts: read inside start()
        await b.start(sb)
        taker = asyncio.gather(*(gate.queue.get() for _ in range(10)))
        for i in range(2, 10):  # more than the credits: only returned credits let it finish
            await w.send([i])
        got = [element for _, element in await taker]
        await a.close()
        await b.close()
        return got

    assert uvloop.run(run()) == [[i] for i in range(10)]


async def test_control_messages_travel_beside_the_channels(
    closing: list[ChannelConnection],
) -> None:
    link = await one_channel(closing, window=1, capacity=1)
    await link.writer.send([1])
    await link.writer.send([2])  # no credit left: messages must not need one
    link.b.send_message({"type": "ack", "checkpoint": 3, "tasks": ["pv-0"]})
    link.a.send_message({"type": "stop"})
    assert await link.a.receive_message() == {"type": "ack", "checkpoint": 3, "tasks": ["pv-0"]}
    assert await link.b.receive_message() == {"type": "stop"}
    await link.b.close()
    with pytest.raises(ChannelError, match="closed"):
        await link.a.receive_message()


async def test_an_unaligned_barrier_takes_no_credit_and_overtakes_the_receiving_end(
    closing: list[ChannelConnection],
) -> None:
    """Across processes too, what it overtook is what was queued or waiting when it came."""
    window, capacity = 2, 2
    link = await one_channel(closing, window=window, capacity=capacity)
    w, r, gate = link.writer, link.reader, link.gate
    for n in range(capacity + window):  # the gate full, the receiver holding the rest
        await w.send([{"n": n}])
    await until(lambda: len(r.pending) == window and w.credits == 0, "the credits run out")
    barrier = CheckpointBarrier(5, 1.0, unaligned=True)
    w.send_priority(barrier)  # no credit needed
    await until(lambda: gate.queue.has_priority, "the barrier skips the line")
    assert w.credits == 0 and len(r.pending) == window
    assert await gate.queue.get() == (0, barrier)
    in_line, _ = gate.in_line(0, 5)
    assert in_line == [[{"n": n}] for n in range(capacity + window)]
    # taking them grants their credits back; the barrier granted none
    for n in range(capacity + window):
        assert (await gate.queue.get())[1] == [{"n": n}]
    await until(lambda: w.credits == window, "every credit back")


async def test_an_aligned_barrier_is_announced_and_goes_ahead_once_its_checkpoint_turned(
    closing: list[ChannelConnection],
) -> None:
    """``checkpoint.aligned_timeout`` across processes: the receiving end times and moves it."""
    window, capacity = 2, 2
    link = await one_channel(closing, window=window, capacity=capacity)
    w, r, gate = link.writer, link.reader, link.gate
    announced: list[CheckpointBarrier] = []
    gate.queue.on_announce = announced.append
    barrier = CheckpointBarrier(5, 1.0, timeoutable=True)
    for n in range(capacity + 1):
        await w.send([{"n": n}])
    await w.send_barrier(barrier)  # in line, behind a waiting element
    await until(lambda: len(r.pending) == 2, "the barrier waits to enter the gate")
    assert announced == [barrier] and not gate.queue.has_priority
    gate.queue.prioritize(5)  # it timed out at the task: the waiting barrier goes ahead ...
    assert not gate.queue.has_priority
    assert (await gate.queue.get())[1] == [{"n": 0}]  # ... as the pump moves it
    await until(lambda: gate.queue.has_priority, "moved into the lane")
    assert await gate.queue.get() == (0, barrier.as_unaligned())
    assert gate.in_line(0, 5) == ([[{"n": 1}], [{"n": 2}]], None)
    await w.send_barrier(CheckpointBarrier(5, 1.0, timeoutable=True))  # late ones: ahead too
    await until(lambda: gate.queue.has_priority, "straight into the lane")
