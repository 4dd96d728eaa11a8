"""The daemon's REST API (aiohttp): status, metrics and control of the running job.

Access rules, enforced by one middleware so no handler can forget them:

- ``/health`` is always open (the container HEALTHCHECK has no token);
- read calls (GET) are open to loopback peers; other peers need the token;
- mutating calls (POST) always need ``Authorization: Bearer <rest.token>``;
  with no token configured they are refused, so job control is never exposed
  by accident. Binding a non-loopback address without a token is refused at
  startup (:class:`~aiostream_ckpt.daemon.settings.DaemonSettings`).

The routes and their contract are in :mod:`aiostream_ckpt.daemon.openapi`.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson
from aiohttp import web

from aiostream_ckpt.daemon.openapi import SPEC
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


def authorized(request: web.Request, token: str | None) -> str | None:
    """``None`` when the request may proceed, else why it may not (for the 401 body)."""
    if request.path in _OPEN_PATHS:
        return None
    mutating = request.method not in _READ_METHODS
    if not mutating and is_loopback(request.remote or ""):
        return None
    if token is None:
        return "mutating calls are disabled: no rest.token is configured"
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        return "missing bearer token"
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return "wrong bearer token"
    return None


def build_app(control: JobControl, token: str | None) -> web.Application:
    """Build the aiohttp application (apart from :class:`RestServer` for in-process tests)."""

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = authorized(request, token)
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
        return _json((await control.savepoints.trigger(directory)).to_json())

    async def stop_with_savepoint(request: web.Request) -> web.Response:
        directory = await _directory(request)
        return _json((await control.savepoints.stop_with_savepoint(directory)).to_json())

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
    app.router.add_post("/job/stop-with-savepoint", stop_with_savepoint)
    app.router.add_post("/job/cancel", cancel)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    return app


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


class RestServer:
    """Serves :func:`build_app` on ``bind:port``; ``port`` 0 picks a free one."""

    def __init__(self, control: JobControl, *, bind: str, port: int, token: str | None) -> None:
        self._app = build_app(control, token)
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
