"""The daemon's REST API (aiohttp): status, metrics and control of the running job.

Access rules, enforced by one middleware so no handler can forget them:

- ``/health`` is always open (the container HEALTHCHECK has no token);
- read calls (GET) are open to loopback peers; other peers need
  ``Authorization: Bearer`` with ``rest.read_token`` or ``rest.token``, so a
  Prometheus scrape can be given a token that reads but cannot control;
- mutating calls (POST) always need ``rest.token``; with none configured they
  are refused, so job control is never exposed by accident. Binding a
  non-loopback address without a token is refused at startup
  (:class:`~aiostream_ckpt.daemon.settings.DaemonSettings`).

Every answer the API gives itself is JSON, errors included (``{"error": ...}``):
a client or a dashboard parses one shape whatever went wrong.

The routes and their contract are in :mod:`aiostream_ckpt.daemon.openapi`.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson
from aiohttp import web

from aiostream_ckpt import failpoints
from aiostream_ckpt.daemon.openapi import SPEC
from aiostream_ckpt.daemon.peers import client_pid
from aiostream_ckpt.daemon.savepoint_disposal import SavepointDisposalError
from aiostream_ckpt.daemon.savepoints import JobNotRunningError, SavepointService
from aiostream_ckpt.daemon.settings import is_loopback
from aiostream_ckpt.errors import AiostreamError, ConfigError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_OPEN_PATHS = frozenset({"/health"})
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class JobControl(Protocol):
    """What the REST API reads and drives (implemented by the daemon service)."""

    savepoints: SavepointService

    def health(self) -> tuple[bool, dict[str, Any]]: ...
    def job_view(self) -> dict[str, Any]: ...
    def operators_view(self) -> dict[str, Any]: ...
    def checkpoints_view(self) -> dict[str, Any]: ...
    def transactions_view(self) -> dict[str, Any]: ...
    def latest_checkpoint_view(self) -> dict[str, Any] | None: ...
    def metrics(self) -> tuple[bytes, str]: ...


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _error(status: int, message: str, **headers: str) -> web.Response:
    resp = _json({"error": message}, status)
    resp.headers.update(headers)
    return resp


def authorized(
    request: web.Request, token: str | None, read_token: str | None = None
) -> str | None:
    """``None`` when the request may proceed, else why it may not (for the 401 body)."""
    if request.path in _OPEN_PATHS:
        return None
    mutating = request.method not in _READ_METHODS
    if not mutating and is_loopback(request.remote or ""):
        return None
    accepted = [token] if mutating else [token, read_token]
    if not any(accepted):
        return "mutating calls are disabled: no rest.token is configured"
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        return "missing bearer token"
    presented = given.strip().encode()
    # compare with every accepted token, so the time taken does not tell which one is close
    matches = [hmac.compare_digest(presented, t.encode()) for t in accepted if t]
    if any(matches):
        return None
    if mutating and read_token and hmac.compare_digest(presented, read_token.encode()):
        return "rest.read_token allows reads only; job control needs rest.token"
    return "wrong bearer token"


def build_app(
    control: JobControl, token: str | None, read_token: str | None = None
) -> web.Application:
    """Build the aiohttp application (apart from :class:`RestServer` for in-process tests)."""

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = authorized(request, token, read_token)
        if refused is not None:
            return _error(401, refused, **{"WWW-Authenticate": 'Bearer realm="aiostream-ckpt"'})
        try:
            return await handler(request)
        except web.HTTPBadRequest as exc:
            return _error(400, exc.text or "bad request")
        except JobNotRunningError as exc:
            return _error(409, str(exc))
        except AiostreamError as exc:
            return _error(500, str(exc))
        except web.HTTPException as exc:  # aiohttp's own answers: 404, 405...
            if exc.status < 400:
                raise
            return _error(exc.status, _http_error_text(request, exc), **_allow(exc))

    async def health(request: web.Request) -> web.Response:
        ok, body = control.health()
        return _json(body, 200 if ok else 503)

    async def job(request: web.Request) -> web.Response:
        return _json(control.job_view())

    async def operators(request: web.Request) -> web.Response:
        return _json(control.operators_view())

    async def transactions(request: web.Request) -> web.Response:
        return _json(control.transactions_view())

    async def checkpoints(request: web.Request) -> web.Response:
        return _json(control.checkpoints_view())

    async def latest(request: web.Request) -> web.Response:
        view = control.latest_checkpoint_view()
        return _json(view) if view is not None else _error(404, "no completed checkpoint yet")

    async def savepoint(request: web.Request) -> web.Response:
        directory = await _directory(request)
        resp = _json((await control.savepoints.trigger(directory)).to_json())
        await resp.prepare(request)
        await resp.write_eof()  # the caller has its answer: the savepoint is complete
        failpoints.hit("savepoint_answered")
        return resp

    async def dispose(request: web.Request) -> web.Response:
        target = await _dispose_target(request)
        try:
            return _json(await control.savepoints.dispose(target))
        except SavepointDisposalError as exc:
            return _error(404 if exc.not_found else 409 if exc.in_use else 400, str(exc))

    async def stop_with_savepoint(request: web.Request) -> web.Response:
        """Answer once the job has ended: with the savepoint, how the job ended, the commit.

        A daemon that is PID 1 (a container) then outlives the client that
        asked (:mod:`.peers`): its exit would kill a ``docker exec``'d client.
        """
        directory = await _directory(request)
        savepoints = control.savepoints
        result = await savepoints.stop_with_savepoint(directory)
        savepoints.answering(True)
        try:
            ended = await savepoints.wait_ended()
            resp = _json(
                {
                    **result.to_json(),
                    "job": ended.value if ended is not None else "stopping",
                    "output_committed": savepoints.final_committed,
                }
            )
            if os.getpid() == 1:
                pid = _client_pid(request)
                if pid is not None:
                    savepoints.outlive(pid)
            await resp.prepare(request)
            await resp.write_eof()
            return resp
        finally:
            savepoints.answering(False)

    async def cancel(request: web.Request) -> web.Response:
        log.info("cancel requested over REST")
        await control.savepoints.cancel()
        return _json({"status": "canceling"}, 202)

    async def metrics(request: web.Request) -> web.Response:
        body, content_type = control.metrics()
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = content_type
        return resp

    async def openapi(request: web.Request) -> web.Response:
        return _json(SPEC)

    app = web.Application(middlewares=[auth])
    app.router.add_get("/health", health)
    app.router.add_get("/job", job)
    app.router.add_get("/operators", operators)
    app.router.add_get("/checkpoints", checkpoints)
    app.router.add_get("/transactions", transactions)
    app.router.add_get("/checkpoints/latest", latest)
    app.router.add_post("/savepoints", savepoint)
    app.router.add_post("/savepoints/dispose", dispose)
    app.router.add_post("/job/stop-with-savepoint", stop_with_savepoint)
    app.router.add_post("/job/cancel", cancel)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    return app


def _http_error_text(request: web.Request, exc: web.HTTPException) -> str:
    if exc.status == 404:
        return f"no such endpoint: {request.path} (the routes are listed at /openapi.json)"
    if exc.status == 405:
        return f"{request.method} is not allowed on {request.path} (see /openapi.json)"
    return exc.reason


def _allow(exc: web.HTTPException) -> dict[str, str]:
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else {}


async def _directory(request: web.Request) -> str | None:
    """Parse the optional ``{"directory": ...}`` body of a savepoint request."""
    raw = await request.read()
    if not raw.strip():
        return None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise web.HTTPBadRequest(text="body must be JSON") from None
    if not isinstance(body, dict) or set(body) - {"directory"}:
        raise web.HTTPBadRequest(text='body must be {"directory": "..."} or empty')
    directory = body.get("directory")
    if directory is not None and (not isinstance(directory, str) or not directory):
        raise web.HTTPBadRequest(text="directory must be a non-empty string")
    return directory


def _client_pid(request: web.Request) -> int | None:
    """Return the pid of the local process that sent ``request`` (None: not found, remote)."""
    transport = request.transport
    if transport is None:
        return None
    peer, local = transport.get_extra_info("peername"), transport.get_extra_info("sockname")
    if not peer or not local or not is_loopback(str(peer[0])):
        return None
    return client_pid((str(peer[0]), int(peer[1])), (str(local[0]), int(local[1])))


async def _dispose_target(request: web.Request) -> str:
    """Parse the ``{"savepoint": "<path or id>"}`` body of a disposal request."""
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        raise web.HTTPBadRequest(text="body must be JSON") from None
    target = body.get("savepoint") if isinstance(body, dict) else None
    if isinstance(target, int) and not isinstance(target, bool) and target >= 0:
        target = str(target)
    if not isinstance(body, dict) or set(body) != {"savepoint"} or not isinstance(target, str):
        raise web.HTTPBadRequest(text='body must be {"savepoint": "<path or id>"}')
    if not target.strip():
        raise web.HTTPBadRequest(text="savepoint must be a path or an id")
    return target.strip()


class RestServer:
    """Serves :func:`build_app` on ``bind:port``; ``port`` 0 picks a free one."""

    def __init__(
        self,
        control: JobControl,
        *,
        bind: str,
        port: int,
        token: str | None,
        read_token: str | None = None,
    ) -> None:
        self._app = build_app(control, token, read_token)
        self._bind = bind
        self._port = port
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> None:
        if self._runner is not None:
            return
        runner = web.AppRunner(self._app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, self._bind, self._port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(
                f"cannot listen on {self._bind}:{self._port} for the REST API: {exc.strerror}"
            ) from exc
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        log.info("REST API listening on http://%s:%d", self._bind, self.port)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> RestServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
