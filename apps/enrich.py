"""Enrich events from an HTTP service with ``map_async``, exactly once.

Every event ``{"app_id": ..., "seq": ...}`` gets the ``segment`` that the
lookup service answers for its ``app_id`` (``GET {service}/lookup?seq=&key=``),
and the enriched event goes to the exactly-once file sink. Up to ``capacity``
lookups are in flight per subtask; those still in flight at a checkpoint are
in it and are looked up again after a crash, and each event's enriched record
is committed exactly once.

Params: ``input`` (JSON-lines file(s), comma-separated) or ``generate=N``;
``output``; ``service`` (base URL); ``capacity`` (default 100); ``timeout``
(seconds, default 10); ``ordered`` (1, or 0 for unordered); ``retries``
(attempts in all, default 1: no retry); ``client`` (``aiohttp``, default, or
``lean``: :mod:`apps.keepalive_http`'s pool of ``capacity`` keep-alive
connections, a fraction of aiohttp's CPU a request); ``mode=sync`` does the same lookup with
a blocking HTTP call in ``map`` (the bench's comparison).
``simulate=SECONDS`` replaces the service by a wait of that long (the same
answer, no HTTP): the bench's measure of the operator without a client's cost.
"""

from __future__ import annotations

import asyncio
import http.client
import re
import time
import urllib.parse
from typing import Any

import aiohttp
import orjson
import yarl

from aiostream_ckpt.api import AsyncFunction, AsyncRetry, RuntimeContext, StreamEnvironment
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink
from aiostream_ckpt_dev.lookup_service import segment_of
from apps.keepalive_http import HttpStatusError, KeepAlivePool
from apps.pv_count import event_source

_SAFE_KEY = re.compile(r"[A-Za-z0-9_.~-]*")


def _query(service: str, event: dict[str, Any]) -> str:
    key = str(event["app_id"])
    if not _SAFE_KEY.fullmatch(key):  # quote() was ~10 % of the lean client's CPU
        key = urllib.parse.quote(key, safe="")
    return f"{service}/lookup?seq={int(event['seq'])}&key={key}"


class HttpLookup(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """One aiohttp session per subtask; the job's ``capacity`` bounds its connections."""

    def __init__(self, service: str) -> None:
        self.service = service.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    async def open(self, ctx: RuntimeContext) -> None:
        # limit=0: map_async's capacity is the bound (aiohttp's default pool is 100);
        # no client timeout: map_async's bounds each call, a second one costs a timer
        # per request
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout()
        )

    async def invoke(self, value: dict[str, Any]) -> dict[str, Any]:
        assert self._session is not None
        # the URL is built encoded (yarl need not parse and quote it again), the
        # body decoded by orjson: together ~45 % of the client's CPU per request
        url = yarl.URL(_query(self.service, value), encoded=True)
        async with self._session.get(url) as resp:
            resp.raise_for_status()
            answer = orjson.loads(await resp.read())
        return {"seq": value["seq"], "app_id": value["app_id"], "segment": answer["segment"]}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class LeanHttpLookup(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """The same lookup over :class:`apps.keepalive_http.KeepAlivePool`, ``capacity`` connections.

    aiohttp's client costs ~200 µs of CPU a request here, a core's worth at
    5 k requests/s; this pool does the GET in ~30 µs (``bench/README.md``).
    """

    def __init__(self, service: str, capacity: int) -> None:
        self.service = service.rstrip("/")
        self.capacity = capacity
        self._pool: KeepAlivePool | None = None

    async def open(self, ctx: RuntimeContext) -> None:
        self._pool = KeepAlivePool(self.service, self.capacity)

    async def invoke(self, value: dict[str, Any]) -> dict[str, Any]:
        assert self._pool is not None
        status, body = await self._pool.get(_query("", value))
        if status >= 400:
            raise HttpStatusError(status, body)
        answer = orjson.loads(body)
        return {"seq": value["seq"], "app_id": value["app_id"], "segment": answer["segment"]}

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()


class BlockingLookup:
    """The same lookup as a synchronous call: the loop waits for every response.

    One keep-alive connection (``http.client``), as a blocking client would
    keep: a new connection per request cost the service ~1.3 ms of CPU each.
    """

    def __init__(self, service: str) -> None:
        self.service = service.rstrip("/")
        url = urllib.parse.urlsplit(self.service)
        self._host, self._port, self._path = url.hostname or "127.0.0.1", url.port or 80, url.path
        self._conn: http.client.HTTPConnection | None = None

    def __call__(self, value: dict[str, Any]) -> dict[str, Any]:
        target = _query(self._path, value)
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=30)
            try:
                self._conn.request("GET", target)
                resp = self._conn.getresponse()
                body = resp.read()
                break
            except (http.client.RemoteDisconnected, ConnectionError):
                self._conn.close()
                self._conn = None
                if attempt == 2:  # a new connection failed too: not an idle one closed
                    raise
        if resp.status >= 400:
            raise HttpStatusError(resp.status, body)
        answer = orjson.loads(body)
        return {"seq": value["seq"], "app_id": value["app_id"], "segment": answer["segment"]}


def _answer(value: dict[str, Any]) -> dict[str, Any]:
    return {"seq": value["seq"], "app_id": value["app_id"], "segment": segment_of(value["app_id"])}


class SimulatedLookup(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """The service's answer after ``latency`` seconds, without HTTP."""

    def __init__(self, latency: float) -> None:
        self.latency = latency

    async def invoke(self, value: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(self.latency)
        return _answer(value)


class BlockingSimulatedLookup:
    def __init__(self, latency: float) -> None:
        self.latency = latency

    def __call__(self, value: dict[str, Any]) -> dict[str, Any]:
        time.sleep(self.latency)
        return _answer(value)


def build(env: StreamEnvironment) -> None:
    p = env.params
    if "output" not in p:
        raise ValueError("set app.output")
    if "service" not in p and "simulate" not in p:
        raise ValueError("set app.service (the lookup service's URL) or app.simulate")
    events = env.from_source(event_source(p), uid="events")
    latency = float(p["simulate"]) if "simulate" in p else None
    service = str(p.get("service", ""))
    if p.get("mode") == "sync":
        blocking: Any = (
            BlockingLookup(service) if latency is None else BlockingSimulatedLookup(latency)
        )
        enriched = events.map(blocking, name="lookup", uid="lookup")
    else:
        attempts = int(p.get("retries", 1))
        capacity = int(p.get("capacity", 100))
        fn: AsyncFunction[dict[str, Any], dict[str, Any]]
        if latency is not None:
            fn = SimulatedLookup(latency)
        elif p.get("client", "aiohttp") == "lean":
            fn = LeanHttpLookup(service, capacity)
        else:
            fn = HttpLookup(service)
        enriched = events.map_async(
            fn,
            capacity=capacity,
            timeout=float(p.get("timeout", 10)),
            ordered=str(p.get("ordered", "1")) != "0",
            retry=AsyncRetry(attempts=attempts) if attempts > 1 else None,
            uid="lookup",
        )
    enriched.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="enriched-sink")
