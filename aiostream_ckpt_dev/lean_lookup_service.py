"""The lookup service as a lean HTTP/1.1 server on an asyncio protocol, for the bench.

``LookupService`` (aiohttp's server) spends ~200 µs of CPU per request; on
the bench's 2 cores a service that costs as much as the job measures the
service. This one answers the same ``GET /lookup?seq=N&key=K`` with the same
JSON, latency, failures and records (``LookupService``'s bookkeeping), over
real TCP with HTTP/1.1 keep-alive, but parses the request line in
``data_received`` and answers from a timer: no task, request object or
middleware per request. On uvloop in its thread. The async I/O tests use
the aiohttp server (issue #20); this one is what the bench measures the
client against, so the job's figures are the job's.

It speaks only what a lookup needs: GETs without a body, pipelined or not
(answers go out in request order), ``Connection: close`` honoured.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.parse
from collections import deque
from typing import cast

import orjson
import uvloop

from aiostream_ckpt_dev.lookup_service import LookupService

_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 500: b"Internal Server Error"}
MAX_HEAD = 64 * 1024


def _response(status: int, body: bytes, keep: bool) -> bytes:
    return b"".join(
        (
            b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status]),
            b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body),
            b"\r\n" if keep else b"Connection: close\r\n\r\n",
            body,
        )
    )


def _seq_and_key(query: bytes) -> tuple[int, str]:
    """``seq`` and ``key`` of a query string (``parse_qs`` was a third of the service's CPU)."""
    params = dict(p.partition(b"=")[::2] for p in query.split(b"&"))
    key = params.get(b"key", b"")
    if b"%" in key or b"+" in key:
        return int(params[b"seq"]), urllib.parse.unquote_plus(key.decode("latin-1"))
    return int(params[b"seq"]), key.decode()


class _Exchange:
    """One request on a connection: its answer, once its latency has passed."""

    __slots__ = ("keep", "response", "timer")

    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.response: bytes | None = None
        self.timer: asyncio.TimerHandle | None = None


class _LeanHttp(asyncio.Protocol):
    def __init__(self, service: LeanLookupService) -> None:
        self.service = service
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.queue: deque[_Exchange] = deque()  # answers leave in request order
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.service._connections.add(self)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while not self.closing:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self._queue_now(400, b'{"error": "request head too large"}', keep=False)
                return
            head = bytes(buf[:end])
            del buf[: end + 4]
            self._request(head)

    def _request(self, head: bytes) -> None:
        line, _, headers = head.partition(b"\r\n")
        parts = line.split(b" ")
        if len(parts) != 3 or parts[0] != b"GET" or not parts[2].startswith(b"HTTP/1."):
            self._queue_now(400, b'{"error": "a GET without a body is expected"}', keep=False)
            return
        lowered = headers.lower()
        keep = parts[2] == b"HTTP/1.1" and b"connection: close" not in lowered
        if b"content-length:" in lowered or b"transfer-encoding:" in lowered:
            keep = False  # a body we do not read would be taken for the next request
        path, _, query = parts[1].partition(b"?")
        if path != b"/lookup":
            self._queue_now(404, b'{"error": "not found"}', keep)
            return
        try:
            seq, key = _seq_and_key(query)
        except (KeyError, ValueError):
            self._queue_now(400, b'{"error": "seq=N&key=K expected"}', keep)
            return
        delay, failed = self.service._begin(seq)
        ex = _Exchange(keep)
        self.queue.append(ex)
        ex.timer = self.loop.call_later(delay, self._answer, ex, seq, key, failed)

    def _answer(self, ex: _Exchange, seq: int, key: str, failed: bool) -> None:
        ex.timer = None
        self.service._end(seq, None)
        status, answer = self.service._answer(seq, key, failed)
        ex.response = _response(status, orjson.dumps(answer), ex.keep)
        self.service._end(seq, status)
        self._flush()

    def _queue_now(self, status: int, body: bytes, keep: bool) -> None:
        ex = _Exchange(keep)
        ex.response = _response(status, body, keep)
        self.queue.append(ex)
        self._flush()

    def _flush(self) -> None:
        queue, transport = self.queue, self.transport
        assert transport is not None
        while queue and queue[0].response is not None:
            ex = queue.popleft()
            transport.write(ex.response)  # type: ignore[arg-type]
            if not ex.keep:
                self.closing = True
                transport.close()
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.service._connections.discard(self)
        for ex in self.queue:
            if ex.timer is not None:  # still sleeping: count it out, never answered
                ex.timer.cancel()
                self.service._end(-1, None)
        self.queue.clear()


class LeanLookupService(LookupService):
    """``LookupService``'s requests and records, served by :class:`_LeanHttp` on uvloop."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._connections: set[_LeanHttp] = set()

    def _new_loop(self) -> asyncio.AbstractEventLoop:
        return uvloop.new_event_loop()

    async def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _LeanHttp(self), "127.0.0.1", 0, backlog=1024)
        port = server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._stopped = asyncio.Event()
        ready.set()
        try:
            await self._stopped.wait()
        finally:
            server.close()
            for conn in list(self._connections):
                if conn.transport is not None:
                    conn.transport.close()
            await server.wait_closed()
