"""``apps.keepalive_http``: the lean lookup client, against aiohttp's server and raw sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest

from aiostream_ckpt_dev.lookup_service import LookupService, segment_of
from apps.enrich import BlockingLookup, LeanHttpLookup
from apps.keepalive_http import HttpError, HttpStatusError, KeepAlivePool, _Connection
from tests.helpers import wait_until


async def test_answers_over_at_most_size_connections_against_the_aiohttp_server() -> None:
    with LookupService(latency=0.002) as svc:
        pool = KeepAlivePool(svc.url, 8)

        async def one(i: int) -> dict[str, Any]:
            status, body = await pool.get(f"/lookup?seq={i}&key=k{i % 5}")
            assert status == 200
            return dict(orjson.loads(body))

        answers = await asyncio.gather(*(one(i) for i in range(100)))  # 100 > 8: some wait
        pool.close()
    assert [a["seq"] for a in answers] == list(range(100))
    assert all(a["segment"] == segment_of(f"k{a['seq'] % 5}") for a in answers)
    assert pool.connections_opened <= 8 and svc.max_concurrent <= 8
    assert pool.connections_opened < 100  # kept alive and reused


async def test_a_cancelled_request_closes_its_connection_so_its_answer_is_never_read() -> None:
    with LookupService(latency=0.0, slow={1: 0.3}) as svc:
        pool = KeepAlivePool(svc.url, 1)
        slow = asyncio.ensure_future(pool.get("/lookup?seq=1&key=a"))
        await wait_until(lambda: svc.max_concurrent == 1)  # the server has it
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        status, body = await pool.get("/lookup?seq=2&key=b")
        assert (status, orjson.loads(body)["seq"]) == (200, 2)
        assert pool.connections_opened == 2
        pool.close()


async def test_the_lookup_raises_on_an_error_status() -> None:
    with LookupService(latency=0.0, fail={5}) as svc:
        lookup = LeanHttpLookup(svc.url, 4)
        await lookup.open(None)  # type: ignore[arg-type]
        ok = await lookup.invoke({"seq": 4, "app_id": "a b/c"})  # quoted key
        assert ok == {"seq": 4, "app_id": "a b/c", "segment": segment_of("a b/c")}
        with pytest.raises(HttpStatusError, match="HTTP 500"):
            await lookup.invoke({"seq": 5, "app_id": "x"})
        await lookup.close()


def test_the_blocking_lookup_keeps_its_connection_alive() -> None:
    with LookupService(latency=0.0, fail={3}) as svc:
        lookup = BlockingLookup(svc.url)
        assert lookup({"seq": 1, "app_id": "k"})["segment"] == segment_of("k")
        assert lookup._conn is not None
        sock = lookup._conn.sock
        assert lookup({"seq": 2, "app_id": "k"})["seq"] == 2
        assert lookup._conn.sock is sock  # the same connection
        with pytest.raises(HttpStatusError):
            lookup({"seq": 3, "app_id": "k"})


@asynccontextmanager
async def raw_server(answer: Callable[[asyncio.StreamWriter], Any]) -> AsyncIterator[str]:
    """A server that reads a request head and writes what ``answer`` writes."""
    conns = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal conns
        conns += 1
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                await answer(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}"


async def test_an_idle_connection_the_server_closed_is_replaced_not_failed() -> None:
    async def answer_then_close(w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # keep-alive, then closes
        await w.drain()
        w.close()

    async with raw_server(answer_then_close) as url:
        pool = KeepAlivePool(url, 1)
        assert await pool.get("/") == (200, b"ok")
        await wait_until(lambda: pool._idle[0]._lost)
        assert await pool.get("/") == (200, b"ok")
        assert pool.connections_opened == 2


async def test_connection_close_answers_are_not_reused_and_no_length_is_an_error() -> None:
    async def close_answer(w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx")

    async with raw_server(close_answer) as url:
        pool = KeepAlivePool(url, 4)
        assert [await pool.get("/") for _ in range(3)] == [(200, b"x")] * 3
        assert pool.connections_opened == 3 and not pool._idle

    async def chunked(w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n")

    async with raw_server(chunked) as url:
        with pytest.raises(HttpError, match="not supported"):
            await KeepAlivePool(url, 1).get("/")


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("cut", [1, 10, 20, 40, 44, 45])
async def test_an_answer_split_across_reads_is_put_together(cut: int) -> None:
    answer = b'HTTP/1.1 404 Not Found\r\ncontent-length: 7\r\nX-A: b\r\n\r\n{"a":1}'
    conn = _Connection()
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    for _ in range(2):  # twice: the state is reset after an answer
        pending = asyncio.ensure_future(conn.request(b"GET / HTTP/1.1\r\n\r\n"))
        await asyncio.sleep(0)
        for part in (answer[:cut], answer[cut : cut + 3], answer[cut + 3 :]):
            if part:
                conn.data_received(part)
        assert await pending == (404, b'{"a":1}', True)
    assert not transport.closed and len(transport.written) == 2
