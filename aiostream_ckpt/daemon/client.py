"""Command-line clients of a running daemon's REST API.

``aiostream-ckpt savepoint trigger|stop`` and ``aiostream-ckpt health`` (the
container HEALTHCHECK). They use the standard library's HTTP client: a
one-shot request needs no event loop, and the health check stays cheap.
The default URL comes from ``AIOSTREAM_REST__PORT`` so the same command works
in a container configured through the environment.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

import orjson

TOKEN_ENV = "AIOSTREAM_REST__TOKEN"


def default_url(env: Mapping[str, str] | None = None) -> str:
    """Loopback URL of the local daemon; a wildcard bind is still reached on loopback."""
    env = os.environ if env is None else env
    port = env.get("AIOSTREAM_REST__PORT", "8081")
    return f"http://127.0.0.1:{port}"


def add_client_args(p: argparse.ArgumentParser, *, token: bool = True) -> None:
    p.add_argument("--url", help="daemon REST URL (default http://127.0.0.1:$AIOSTREAM_REST__PORT)")
    if token:
        p.add_argument("--token", help=f"bearer token (default ${TOKEN_ENV})")


def request(
    method: str,
    url: str,
    *,
    token: str | None = None,
    body: dict[str, Any] | None = None,
    timeout: float = 300.0,
) -> tuple[int, Any]:
    """(HTTP status, decoded JSON or text); raises ``OSError`` when nothing answers."""
    data = orjson.dumps(body) if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, orjson.loads(raw)
    except orjson.JSONDecodeError:
        return status, raw.decode(errors="replace")


def savepoint_main(args: argparse.Namespace) -> int:
    """``savepoint trigger`` / ``savepoint stop``: 0 done, 1 refused or failed, 2 unreachable."""
    url = (args.url or default_url()).rstrip("/")
    token = args.token or os.environ.get(TOKEN_ENV)
    path = "/savepoints" if args.action == "trigger" else "/job/stop-with-savepoint"
    body = {"directory": str(args.dir)} if args.dir else {}
    try:
        status, answer = request("POST", url + path, token=token, body=body)
    except OSError as exc:
        print(f"aiostream-ckpt: error: cannot reach the daemon at {url}: {exc}", file=sys.stderr)
        return 2
    if status == 200 and isinstance(answer, dict):
        print(orjson.dumps(answer).decode())
        return 0
    message = answer.get("error") if isinstance(answer, dict) else answer
    print(f"aiostream-ckpt: savepoint {args.action} failed ({status}): {message}", file=sys.stderr)
    return 1


def health_main(args: argparse.Namespace) -> int:
    """0 when ``/health`` answers 200 within the timeout (HEALTHCHECK contract), else 1."""
    url = (args.url or default_url()).rstrip("/")
    try:
        status, answer = request("GET", url + "/health", timeout=args.timeout)
    except OSError as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    print(orjson.dumps(answer).decode() if isinstance(answer, dict) else answer)
    return 0 if status == 200 else 1
