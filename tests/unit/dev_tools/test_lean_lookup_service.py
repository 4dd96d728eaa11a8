"""The bench's lean lookup service answers as the aiohttp one does, over real HTTP/1.1."""

from __future__ import annotations

import asyncio

import orjson

from aiostream_ckpt_dev.lean_lookup_service import LeanLookupService
from aiostream_ckpt_dev.lookup_service import LookupService, segment_of


async def exchange(url: str, requests: bytes, answers: int) -> list[tuple[bytes, bytes]]:
    """Send ``requests`` in one write; read ``answers`` answers (head, body)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(requests)
    out = []
    for _ in range(answers):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        out.append((head, await reader.readexactly(length)))
    writer.close()
    return out


def get(target: str, extra: str = "") -> bytes:
    return f"GET {target} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


async def test_same_answers_as_the_aiohttp_service_pipelined_in_request_order() -> None:
    key = "a b/ü"
    quoted = "a+b%2F%C3%BC"
    reqs = get(f"/lookup?seq=1&key={quoted}") + get("/lookup?seq=2&key=k") + get("/lookup?seq=3")
    with LeanLookupService(latency=0.0, slow={1: 0.05}, fail={3}) as lean:
        got = await exchange(lean.url, reqs, 3)
        assert sorted(lean.served_seqs()) == [1, 2, 3] and lean.max_concurrent == 3
    with LookupService(latency=0.0, fail={3}) as ref:
        want = await exchange(ref.url, reqs, 3)
    # seq 1 is slow: its answer still goes first, as pipelining requires
    assert [orjson.loads(b) for _, b in got] == [orjson.loads(b) for _, b in want]
    assert orjson.loads(got[0][1]) == {"seq": 1, "key": key, "segment": segment_of(key)}
    assert [h.split(b" ")[1] for h, _ in got] == [b"200", b"200", b"500"]


async def test_connection_close_is_honoured_and_bad_requests_get_4xx() -> None:
    with LeanLookupService(latency=0.0) as lean:
        [(head, _)] = await exchange(
            lean.url, get("/lookup?seq=1&key=k", "Connection: close\r\n"), 1
        )
        assert b"connection: close" in head.lower()
        [(head, _)] = await exchange(lean.url, get("/other"), 1)
        assert head.startswith(b"HTTP/1.1 404")
        [(head, _)] = await exchange(lean.url, get("/lookup?key=k"), 1)
        assert head.startswith(b"HTTP/1.1 400")
        [(head, _)] = await exchange(lean.url, b"POST /lookup HTTP/1.1\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 400")
