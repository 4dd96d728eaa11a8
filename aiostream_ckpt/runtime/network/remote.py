"""Channels between processes: one stream socket per pair of processes, credits per channel.

A :class:`ChannelConnection` carries any number of channels both ways over one
unix stream socket (a socket pair made by the parent process, or an accepted
connection). Its sending ends are :class:`RemoteChannelWriter`, used by the
output gates exactly like an in-process
:class:`~aiostream_ckpt.runtime.channels.ChannelWriter`; its receiving ends,
:class:`RemoteInput`, put what arrives into the downstream task's
:class:`~aiostream_ckpt.runtime.channels.InputGate`, so the task's loop, barrier
alignment and watermarks do not know whether a channel crosses a process.

An unaligned barrier (``checkpoint.unaligned``) is sent at once, spending no
credit, and enters the receiving gate's priority lane, ahead of what this
channel has queued there or waiting here (:meth:`InputGate.in_line` counts
those as the channel's in-flight elements).

Why credits (Flink's credit-based flow control): a socket buffer is not a
bound the engine controls, and one connection carries many channels, so a
full gate must stop *its* channel, not the whole connection. A sender starts
with ``window`` credits per channel and spends one per element (batch or
control element, so barriers keep their place); the receiver grants one back
when the element has entered the gate's bounded queue. When a task stops
taking from its gate, the receiver stops granting, the sender's ``send``
suspends on its last credit, and backpressure reaches the source in the other
process as it does in one. The bytes in flight per channel are at most
``window`` batches; the receiving callback never blocks, so one slow channel
does not stall the others on the connection.

A peer that closes on purpose says goodbye first; any other end of the
connection (EOF, reset, a malformed frame) is a :class:`~aiostream_ckpt.errors.ChannelError`
set on :attr:`ChannelConnection.failure` and raised by every ``send``, so the
attempt fails and the restart strategy takes over.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Callable
from enum import Enum
from typing import Any, cast

import orjson

from aiostream_ckpt.aio import BackgroundTasks
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier
from aiostream_ckpt.errors import AiostreamError, ChannelError
from aiostream_ckpt.runtime.channels import InputGate
from aiostream_ckpt.runtime.wire import (
    HEADER,
    BatchCodec,
    FrameKind,
    credit_count,
    credit_payload,
    decode_control,
    encode_control,
)

_HEADER_SIZE = HEADER.size
_BATCH = FrameKind.BATCH
_CREDIT = FrameKind.CREDIT
_GOODBYE = FrameKind.GOODBYE
_MESSAGE = FrameKind.MESSAGE


class ConnectionState(Enum):
    CREATED = "created"
    OPEN = "open"
    CLOSED = "closed"  # closed on purpose, by either side
    FAILED = "failed"

    def can_become(self, other: ConnectionState) -> bool:
        return other in _CONNECTION_TRANSITIONS[self]


_CONNECTION_TRANSITIONS = {
    ConnectionState.CREATED: {ConnectionState.OPEN, ConnectionState.CLOSED, ConnectionState.FAILED},
    ConnectionState.OPEN: {ConnectionState.CLOSED, ConnectionState.FAILED},
    ConnectionState.CLOSED: set(),
    ConnectionState.FAILED: set(),
}


class RemoteChannelWriter:
    """The sending end of one channel: ``send`` spends a credit, suspends without one."""

    __slots__ = (
        "_conn",
        "_waiter",
        "channel_id",
        "credits",
        "index",
        "suspensions",
        "trusted",
        "window",
    )

    def __init__(
        self, conn: ChannelConnection, channel_id: int, window: int, trusted: bool = False
    ) -> None:
        self._conn = conn
        self.channel_id = channel_id
        #: the records sent are known exact for the codec (``BatchCodec.encode``)
        self.trusted = trusted
        #: the receiver's channel index (kept for symmetry with ``ChannelWriter``)
        self.index = channel_id
        self.window = window
        self.credits = window
        #: how often ``send`` had to wait for a credit (backpressure from the receiver)
        self.suspensions = 0
        self._waiter: asyncio.Future[None] | None = None

    @property
    def suspended(self) -> bool:
        """Whether a ``send`` is waiting for the receiver to grant a credit."""
        return self._waiter is not None and not self._waiter.done()

    def fill_ratio(self) -> float:
        """Credits spent of the window (1.0: the next send waits for the receiver)."""
        return 1.0 - max(self.credits, 0) / self.window

    async def send(self, element: Any) -> None:
        if self.credits <= 0:
            await self._wait_for_credit()
        # a refused record spends no credit
        self._conn.send_element(self.channel_id, element, self.trusted)
        self.credits -= 1

    def send_priority(self, element: Any) -> None:
        """Send an unaligned barrier now, without a credit: the receiver grants none for it."""
        self._conn.send_element(self.channel_id, element)

    async def send_barrier(self, barrier: CheckpointBarrier) -> None:
        """Send an aligned barrier in line (the receiving end announces it, may move it ahead)."""
        await self.send(barrier)

    async def _wait_for_credit(self) -> None:
        while self.credits <= 0:
            self._conn.check_usable()
            self.suspensions += 1
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def grant(self, n: int) -> None:
        self.credits += n
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def fail(self, exc: BaseException) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)


class RemoteInput:
    """The receiving end of one channel: elements into ``gate`` as channel ``index``.

    What arrives goes straight into the gate's queue while it has room and
    nothing of this channel waits; otherwise it waits here (at most ``window``
    elements, the sender's credits) for :meth:`pump`. ``wrap`` marks batches of
    a two-input operator's second input, as its in-process writer does.
    """

    __slots__ = ("_conn", "_wake", "channel_id", "gate", "index", "pending", "received", "wrap")

    def __init__(
        self,
        conn: ChannelConnection,
        channel_id: int,
        gate: InputGate,
        index: int,
        wrap: Callable[[list[Any]], Any] | None,
    ) -> None:
        self._conn = conn
        self.channel_id = channel_id
        self.gate = gate
        self.index = index
        self.wrap = wrap
        self.pending: deque[tuple[int, Any]] = deque()
        gate.attach_pending(index, self.pending)
        self.received = 0
        self._wake = asyncio.Event()

    def receive(self, element: Any) -> bool:
        """Take one element; True when it entered the gate (grant its credit now)."""
        self.received += 1
        queue = self.gate.queue
        if type(element) is CheckpointBarrier:
            if element.unaligned:
                queue.put_priority((self.index, element), len(self.pending))  # without a credit
                return False
            if queue.announce(element):  # its checkpoint turned unaligned at the task
                queue.put_priority((self.index, element.as_unaligned()), len(self.pending))
                return True
        if self.wrap is not None and type(element) is list:
            element = self.wrap(element)
        if not self.pending and not queue.full():
            queue.put_nowait((self.index, element))
            return True
        self.pending.append((self.index, element))
        if len(self.pending) > self._conn.window:
            raise ChannelError(
                f"channel {self.channel_id}: the sender sent more than its "
                f"{self._conn.window} credits allow"
            )
        self._wake.set()
        return False

    async def pump(self) -> None:
        """Move what waits here into the gate as it makes room, granting a credit for each."""
        pending = self.pending
        queue = self.gate.queue
        put = queue.put
        while True:
            if not pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            channel, element = pending[0]
            if type(element) is CheckpointBarrier and element.checkpoint_id <= queue.prioritized:
                queue.put_priority((channel, element.as_unaligned()))  # turned unaligned meanwhile
            else:
                await put(pending[0])
            pending.popleft()
            self._conn.grant(self.channel_id, 1)


class ChannelConnection(asyncio.Protocol):
    """One socket to another process, carrying channels both ways (see the module docstring).

    Declare every channel (:meth:`writer`, :meth:`reader`) before :meth:`start`:
    both processes build the same job graph, so both know the channel ids.
    """

    def __init__(self, name: str, codec: BatchCodec, *, window: int = 8) -> None:
        if window < 1:
            raise ChannelError(f"channel window must be >= 1, not {window}", retriable=False)
        self.name = name
        self.codec = codec
        self.window = window
        self.state = ConnectionState.CREATED
        loop = asyncio.get_running_loop()
        #: resolves to the error that ended the connection (the owner fails the attempt)
        self.failure: asyncio.Future[BaseException] = loop.create_future()
        self._lost: asyncio.Future[None] = loop.create_future()
        self._writers: dict[int, RemoteChannelWriter] = {}
        self._inputs: dict[int, RemoteInput] = {}
        self._grants: dict[int, int] = {}
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._goodbye_received = False
        #: control messages from the peer, in order (see :meth:`send_message`)
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        #: sees each control message as it arrives, before it is queued: what must be
        #: known before anything read from another socket in the same loop turn runs
        self.on_message: Callable[[dict[str, Any]], None] | None = None
        self._bg = BackgroundTasks(self._fail)

    # -- channels -----------------------------------------------------------------------

    def writer(self, channel_id: int, *, trusted: bool = False) -> RemoteChannelWriter:
        """Declare a sending channel; ``trusted``: its records need no exactness check."""
        self._check_declaring(channel_id, self._writers)
        w = self._writers[channel_id] = RemoteChannelWriter(self, channel_id, self.window, trusted)
        return w

    def reader(
        self,
        channel_id: int,
        gate: InputGate,
        index: int,
        wrap: Callable[[list[Any]], Any] | None = None,
    ) -> RemoteInput:
        self._check_declaring(channel_id, self._inputs)
        r = self._inputs[channel_id] = RemoteInput(self, channel_id, gate, index, wrap)
        return r

    def _check_declaring(self, channel_id: int, table: dict[int, Any]) -> None:
        if self.state is not ConnectionState.CREATED:
            raise ChannelError(f"{self.name}: channels are declared before start", retriable=False)
        if channel_id in table:
            raise ChannelError(f"{self.name}: channel {channel_id} declared twice", retriable=False)

    # -- lifecycle ----------------------------------------------------------------------

    def _transition(self, new: ConnectionState) -> None:
        if not self.state.can_become(new):
            raise AiostreamError(f"connection {self.name}: cannot go from {self.state} to {new}")
        self.state = new

    async def start(self, sock: socket.socket) -> None:
        """Attach the connected unix stream socket ``sock`` and start receiving."""
        if self.state is not ConnectionState.CREATED or self._transport is not None:
            return
        sock.setblocking(False)
        await asyncio.get_running_loop().create_unix_connection(lambda: self, sock=sock)
        for r in self._inputs.values():
            self._bg.spawn(r.pump(), f"{self.name}-pump-{r.channel_id}")

    async def close(self) -> None:
        """Say goodbye, flush what was sent, close; idempotent."""
        if self.state is ConnectionState.OPEN:
            self._transition(ConnectionState.CLOSED)
            assert self._transport is not None
            self._write_frame(0, _GOODBYE, b"")
            self._transport.close()
            await asyncio.shield(self._lost)
        elif self.state is ConnectionState.CREATED:
            self._transition(ConnectionState.CLOSED)
        await self._bg.cancel_all()

    async def wait_closed(self) -> None:
        """Return when the socket is closed, by either side, on purpose or not."""
        await asyncio.shield(self._lost)

    async def __aenter__(self) -> ChannelConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def check_usable(self) -> None:
        """Raise why nothing more can be sent, if so."""
        if self.failure.done():
            raise self.failure.result()
        if self.state is not ConnectionState.OPEN or self._goodbye_received:
            raise ChannelError(f"connection {self.name} is closed", retriable=False)

    def _fail(self, exc: BaseException) -> None:
        if self.failure.done():
            return
        if self.state is not ConnectionState.CLOSED:
            self.state = ConnectionState.FAILED
        self.failure.set_result(exc)
        for w in self._writers.values():
            w.fail(exc)
        if self._transport is not None:
            self._transport.abort()

    # -- sending ------------------------------------------------------------------------

    def send_element(self, channel_id: int, element: Any, trusted: bool = False) -> None:
        if type(element) is list:
            kind, payload = _BATCH, self.codec.encode(element, trusted)
        else:
            kind, payload = encode_control(element)
        self.check_usable()
        self._write_frame(channel_id, kind, payload)

    def send_message(self, message: dict[str, Any]) -> None:
        """Send a control message (a JSON object); it takes no credit and waits for none."""
        self.check_usable()
        self._write_frame(0, _MESSAGE, orjson.dumps(message))

    async def receive_message(self) -> dict[str, Any]:
        """Return the peer's next message; raise why the connection ended if it did."""
        if self.messages.empty():
            waiter = asyncio.ensure_future(self.messages.get())
            watch: set[asyncio.Future[Any]] = {waiter, self.failure, self._lost}
            done, _ = await asyncio.wait(watch, return_when=asyncio.FIRST_COMPLETED)
            if waiter not in done:
                waiter.cancel()
                self.check_usable()
                raise ChannelError(f"connection {self.name} was closed by its peer")
            return waiter.result()
        return self.messages.get_nowait()

    def _write_frame(self, channel_id: int, kind: int, payload: bytes) -> None:
        assert self._transport is not None
        self._transport.writelines((HEADER.pack(len(payload), channel_id, kind), payload))

    def grant(self, channel_id: int, n: int) -> None:
        if self.state is ConnectionState.OPEN and not self._goodbye_received:
            self._write_frame(channel_id, _CREDIT, credit_payload(n))

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        # open now: uvloop may deliver data (and so grant credits) before start() resumes
        self._transition(ConnectionState.OPEN)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        end = len(buf)
        pos = 0
        grants = self._grants
        try:
            while end - pos >= _HEADER_SIZE:
                length, channel_id, kind = HEADER.unpack_from(buf, pos)
                stop = pos + _HEADER_SIZE + length
                if stop > end:
                    break
                payload = bytes(buf[pos + _HEADER_SIZE : stop])
                pos = stop
                if kind == _CREDIT:
                    self._channel(self._writers, channel_id).grant(credit_count(payload))
                elif kind == _GOODBYE:
                    self._goodbye_received = True
                elif kind == _MESSAGE:
                    message = orjson.loads(payload)
                    if self.on_message is not None:
                        self.on_message(message)
                    self.messages.put_nowait(message)
                else:
                    element = (
                        self.codec.decode(payload)
                        if kind == _BATCH
                        else decode_control(kind, payload)
                    )
                    if self._channel(self._inputs, channel_id).receive(element):
                        grants[channel_id] = grants.get(channel_id, 0) + 1
        except Exception as exc:
            self._fail(
                exc if isinstance(exc, AiostreamError) else ChannelError(f"{self.name}: {exc}")
            )
            return
        finally:
            del buf[:pos]
        if grants:
            for channel_id, n in grants.items():
                self.grant(channel_id, n)
            grants.clear()

    def _channel(self, table: dict[int, Any], channel_id: int) -> Any:
        try:
            return table[channel_id]
        except KeyError:
            raise ChannelError(
                f"{self.name}: a frame for undeclared channel {channel_id}", retriable=False
            ) from None

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost tells whether it was a goodbye

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._lost.done():
            self._lost.set_result(None)
        if self.state is ConnectionState.CLOSED or self.failure.done():
            return
        if self._goodbye_received and exc is None and not self._buf:
            self._transition(ConnectionState.CLOSED)
            for w in self._writers.values():
                w.fail(ChannelError(f"connection {self.name} was closed by its peer"))
            return
        why = f"{type(exc).__name__}: {exc}" if exc else "end of file without goodbye"
        self._fail(ChannelError(f"connection {self.name}: the peer process is gone ({why})"))
