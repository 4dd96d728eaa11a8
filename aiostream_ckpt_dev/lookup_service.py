"""A real HTTP lookup service on a loopback port, for the async I/O tests and bench.

``GET /lookup?seq=N&key=K`` answers ``{"seq": N, "key": K, "segment": ...}``
after ``latency`` seconds (per-seq overrides in ``slow``), or HTTP 500 for the
seqs in ``fail`` and for a seeded ``failure_rate`` share of requests. Every
request it served is recorded (seq, status), and it counts how many it was
serving at once, so a test can check a capacity bound from the server's side.

It runs its own event loop in a thread (``with LookupService(...) as svc``), so
a job in the same process (``execute_and_collect``) or in a child process
(kill -9 tests) can call it.
"""

from __future__ import annotations

import asyncio
import random
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


def segment_of(key: str) -> str:
    """Return the deterministic answer the service gives for ``key`` (tests recompute it)."""
    return f"seg-{zlib.crc32(key.encode()) % 7}"


@dataclass
class ServedRequest:
    seq: int
    status: int


@dataclass
class LookupService:
    """The service; ``url`` is set once it listens."""

    latency: float = 0.01
    failure_rate: float = 0.0
    seed: int = 0
    fail: set[int] = field(default_factory=set)
    slow: dict[int, float] = field(default_factory=dict)
    url: str = ""
    served: list[ServedRequest] = field(default_factory=list)
    max_concurrent: int = 0
    _current: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._stopped: asyncio.Event | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        seq = int(request.query["seq"])
        key = request.query.get("key", "")
        delay, failed = self._begin(seq)
        try:
            await asyncio.sleep(delay)  # the service's own latency
        finally:
            self._end(seq, None)
        status, answer = self._answer(seq, key, failed)
        self._end(seq, status)
        return web.json_response(answer, status=status)

    # -- what a request does, whatever the server (lean_lookup_service shares it) -----

    def _begin(self, seq: int) -> tuple[float, bool]:
        """Count a request in; return its latency and whether it fails."""
        with self._lock:
            self._current += 1
            self.max_concurrent = max(self.max_concurrent, self._current)
            failed = seq in self.fail or self._rng.random() < self.failure_rate
        return self.slow.get(seq, self.latency), failed

    def _end(self, seq: int, status: int | None) -> None:
        """Count a request out once it slept (``None``), record it once answered."""
        with self._lock:
            if status is None:
                self._current -= 1
            else:
                self.served.append(ServedRequest(seq, status))

    @staticmethod
    def _answer(seq: int, key: str, failed: bool) -> tuple[int, dict[str, Any]]:
        if failed:
            return 500, {"error": f"injected failure for seq {seq}"}
        return 200, {"seq": seq, "key": key, "segment": segment_of(key)}

    def requests_for(self, seq: int) -> int:
        with self._lock:
            return sum(1 for r in self.served if r.seq == seq)

    def served_seqs(self) -> list[int]:
        with self._lock:
            return [r.seq for r in self.served]

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> LookupService:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = self._new_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve(ready))
            except BaseException as exc:  # reported to start()'s caller
                errors.append(exc)
                ready.set()
            finally:  # a hung request's handler is cancelled, not left pending
                pending = asyncio.all_tasks(loop)
                for t in pending:
                    t.cancel()
                if pending:
                    loop.run_until_complete(asyncio.wait(pending))
                loop.close()

        self._thread = threading.Thread(target=run, name="lookup-service", daemon=True)
        self._thread.start()
        ready.wait(30)
        if errors:
            raise errors[0]
        if not self.url:
            raise RuntimeError("lookup service did not start within 30 s")
        return self

    def _new_loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.new_event_loop()

    async def _serve(self, ready: threading.Event) -> None:
        app = web.Application()
        app.router.add_get("/lookup", self._handle)
        # on stop, do not wait for requests still sleeping (a test's hung call)
        runner = self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        server: Any = site._server  # aiohttp has no public accessor for the bound port
        port = server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._stopped = asyncio.Event()
        ready.set()
        await self._stopped.wait()
        await runner.cleanup()

    def stop(self) -> None:
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stopped.set)
        if self._thread is not None:
            self._thread.join(30)

    def __enter__(self) -> LookupService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
