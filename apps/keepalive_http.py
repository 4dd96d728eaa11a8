"""A lean keep-alive HTTP/1.1 GET client on asyncio protocols: what a lookup needs, no more.

aiohttp's client spends ~150-200 µs of CPU per request in CPython (request
and response objects, headers multidicts, cookie filtering, tracing hooks,
a task and a few futures per call); at 16 k lookups/s that alone is more
than a core. A lookup needs a GET and a body: this pool writes a prebuilt
request on an idle connection and parses the status line, ``Content-Length``
and ``Connection`` of the answer in ``data_received``: one future per
request and no task. Up to ``size`` connections to one ``host:port``, each
with one request out at a time (no pipelining); ``map_async``'s capacity is
the real bound, so ``size = capacity`` never makes a call wait.

Not a general client: no TLS, redirects, chunked bodies, compression or
proxies (an answer without ``Content-Length`` is an error). A connection
whose request was cancelled (``map_async``'s timeout) or failed is closed,
never reused, so a late answer cannot be read as the next request's. A
request that fails on a reused connection before any answer byte (the
server closed it while idle) is sent once more on a new connection.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections import deque
from typing import cast

#: An answer's head larger than this is an error (a lookup answers a few headers).
MAX_HEAD = 64 * 1024


class HttpError(Exception):
    """A malformed or unsupported answer, or a connection lost before the whole answer."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        #: lost on a reused connection before any answer byte: safe to send again
        self.retryable = retryable


class HttpStatusError(HttpError):
    """An answer with status >= 400 (the body is kept for the error message)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status = status
        self.body = body


class _Connection(asyncio.Protocol):
    """One socket; ``request`` writes a GET and returns its ``(status, body, keep_alive)``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.served = 0
        self._waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self._status = 0
        self._keep = True
        self._buf = bytearray()  # a partial answer (most arrive in one read)
        self._body_at = -1  # where the body starts once the head is parsed
        self._end = -1
        self._lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():  # nothing asked: the server misbehaves
            self.close()
            return
        buf = self._buf
        if buf:
            buf += data
            data = bytes(buf)
        try:
            if self._body_at < 0 and not self._parse_head(data):
                if not buf:
                    buf += data
                return
        except HttpError as exc:
            waiter.set_exception(exc)
            self.close()
            return
        if len(data) < self._end:
            if not buf:
                buf += data
            return
        if len(data) > self._end:  # bytes past the answer to a single request
            waiter.set_exception(HttpError(f"{len(data) - self._end} bytes after the answer"))
            self.close()
            return
        body = data[self._body_at :]
        buf.clear()
        self._body_at = self._end = -1
        self._waiter = None
        self.served += 1
        waiter.set_result((self._status, body, self._keep))

    def _parse_head(self, data: bytes) -> bool:
        """Parse the head if it is all in ``data``: the answer's status, length and keep-alive."""
        head_end = data.find(b"\r\n\r\n")
        if head_end < 0:
            if len(data) > MAX_HEAD:
                raise HttpError(f"answer head over {MAX_HEAD} bytes")
            return False
        # finds on the lowered head, not a loop over its lines: ~half the client's parse
        head = data[: head_end + 2].lower()
        if not head.startswith(b"http/1.") or head[8:9] != b" ":
            raise HttpError(f"not an HTTP/1.x answer: {data[:100]!r}")
        self._status = int(head[9:12])
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            raise HttpError("an answer without Content-Length is not supported")
        length = int(head[at + 17 : head.index(b"\r\n", at + 17)])
        if b"\r\ntransfer-encoding:" in head:
            raise HttpError("a transfer-encoding is not supported")
        if head[7:8] == b"1":  # HTTP/1.1: keep-alive unless closed
            self._keep = b"\r\nconnection: close" not in head
        else:
            self._keep = b"\r\nconnection: keep-alive" in head
        self._body_at = head_end + 4
        self._end = self._body_at + length
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            started = bool(self._buf)
            err = HttpError(
                f"connection lost {'during' if started else 'before'} the answer",
                retryable=not started and self.served > 0,
            )
            err.__cause__ = exc
            waiter.set_exception(err)

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost reports a pending request

    async def request(self, data: bytes) -> tuple[int, bytes, bool]:
        assert self.transport is not None and self._waiter is None
        if self._lost:
            raise HttpError("connection lost while idle", retryable=self.served > 0)
        waiter: asyncio.Future[tuple[int, bytes, bool]]
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class KeepAlivePool:
    """Keep-alive GETs to the host of ``base_url`` over at most ``size`` connections.

    Slots are counted by hand rather than with an ``asyncio.Semaphore``: its
    ``async with`` costs two coroutines a request and its release scans the
    waiters, for a bound that ``map_async`` already keeps.
    """

    def __init__(self, base_url: str, size: int) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"{base_url!r}: an http:// URL with a host is needed")
        if size < 1:
            raise ValueError(f"size={size}: at least one connection")
        self.host = url.hostname
        self.port = url.port or 80
        self.prefix = url.path.rstrip("/")
        self.size = size
        self._host_header = f"Host: {url.netloc}\r\n\r\n"
        self._idle: list[_Connection] = []
        self._open = 0  # connections open or being opened, idle or busy
        self._waiters: deque[asyncio.Future[_Connection | None]] = deque()
        self.connections_opened = 0

    async def get(self, target: str) -> tuple[int, bytes]:
        """GET ``prefix + target`` (already percent-encoded); return ``(status, body)``."""
        data = f"GET {self.prefix}{target} HTTP/1.1\r\n{self._host_header}".encode()
        conn = self._idle.pop() if self._idle else await self._take()
        while True:
            try:
                status, body, keep = await conn.request(data)
            except BaseException as exc:  # cancelled or failed: never reuse the connection
                conn.close()
                if isinstance(exc, HttpError) and exc.retryable:
                    try:  # the server had closed it while idle: same slot, another one
                        conn = self._idle.pop() if self._idle else await self._connect()
                    except BaseException:
                        self._give(None)
                        raise
                    continue
                self._give(None)
                raise
            if keep:
                self._give(conn)
            else:
                conn.close()
                self._give(None)
            return status, body

    async def _take(self) -> _Connection:
        """Open a connection in a free slot, or wait for one a request gives back."""
        if self._open >= self.size:
            waiter: asyncio.Future[_Connection | None]
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                conn = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():  # handed over as we were cancelled
                    self._give(waiter.result())
                raise
            if conn is not None:
                return conn
        else:
            self._open += 1
        try:  # this slot is ours: a connection in it, or handed on
            return await self._connect()
        except BaseException:
            self._give(None)
            raise

    def _give(self, conn: _Connection | None) -> None:
        """Hand a connection (or, None, its slot) to the next waiter, else keep it idle."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if conn is None:
            self._open -= 1
        else:
            self._idle.append(conn)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Connection, self.host, self.port)
        self.connections_opened += 1
        return conn

    def close(self) -> None:
        """Close the idle connections (those busy close when their request ends)."""
        for conn in self._idle:
            conn.close()
        self._idle.clear()
