"""Command-line clients of a running daemon's REST API.

``aiostream-ckpt savepoint trigger|stop`` and ``aiostream-ckpt health`` (the
container HEALTHCHECK). They use the standard library's HTTP client: a
one-shot request needs no event loop, and the health check stays cheap.
``health`` finds the daemon through the address file it publishes (see
:mod:`.address`), so it follows ``--set``/TOML/``rest.port=0`` ports too.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
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
    # here, not at the top: ``run`` declares these commands' options (this module) and
    # would pay for urllib's imports (~0.03 s of CPU, http and email) on every start
    import urllib.error
    import urllib.request

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


#: ``savepoint trigger|stop|dispose`` exit codes: what happened to the savepoint.
EXIT_DONE = 0  # taken (and for stop: the job stopped with its output committed); disposed of
EXIT_REFUSED = 1  # refused (token, job not running, bad request, in use): nothing changed
EXIT_NO_ANSWER = 2  # no daemon there, or no answer: the outcome is not known
EXIT_SAVEPOINT_FAILED = 3  # the savepoint failed; the job goes on
EXIT_STOP_INCOMPLETE = 4  # stop: the savepoint was taken, the stop did not end as it should


def savepoint_main(args: argparse.Namespace) -> int:
    """``savepoint trigger|stop|dispose``; the exit code says what happened (``EXIT_*``).

    A stop is answered once the job has ended: 0 means the savepoint is
    complete, the job stopped and the savepoint's output is committed.
    """
    url = (args.url or default_url()).rstrip("/")
    token = args.token or os.environ.get(TOKEN_ENV)
    body: dict[str, Any]
    if args.action == "dispose":
        path = "/savepoints/dispose"
        target = args.savepoint if args.savepoint.isdigit() else str(Path(args.savepoint).resolve())
        body = {"savepoint": target}
    else:
        path = "/savepoints" if args.action == "trigger" else "/job/stop-with-savepoint"
        body = {"directory": str(args.dir)} if args.dir else {}
    import urllib.error

    try:
        status, answer = request("POST", url + path, token=token, body=body)
    except urllib.error.URLError as exc:
        print(f"aiostream-ckpt: error: cannot reach the daemon at {url}: {exc}", file=sys.stderr)
        return EXIT_NO_ANSWER
    except OSError as exc:
        print(
            f"aiostream-ckpt: error: the daemon at {url} did not answer the savepoint "
            f"{args.action} ({exc}); what happened is not known: see its log and savepoint.dir",
            file=sys.stderr,
        )
        return EXIT_NO_ANSWER
    if status == 200 and isinstance(answer, dict):
        print(orjson.dumps(answer).decode())
        if args.action == "stop":
            return stop_outcome(answer)
        return EXIT_DONE
    message = answer.get("error") if isinstance(answer, dict) else answer
    print(f"aiostream-ckpt: savepoint {args.action} failed ({status}): {message}", file=sys.stderr)
    if status == 500 and args.action != "dispose":
        return EXIT_SAVEPOINT_FAILED
    return EXIT_REFUSED


def stop_outcome(answer: dict[str, Any]) -> int:
    """0 when the stop ended as asked, else 4 with what did not (the savepoint is usable)."""
    job, committed = answer.get("job"), answer.get("output_committed")
    if job in ("stopped_with_savepoint", "finished") and committed:
        return EXIT_DONE
    why = (
        f"the job is {job}"
        if job not in ("stopped_with_savepoint", "finished")
        else "its output up to the savepoint was not confirmed committed (a restore from the "
        "savepoint commits it)"
    )
    print(
        f"aiostream-ckpt: savepoint {answer.get('id')} is complete at {answer.get('path')}, "
        f"but the stop did not end as it should: {why}; see the daemon's log",
        file=sys.stderr,
    )
    return EXIT_STOP_INCOMPLETE


def daemon_address_file(env: Mapping[str, str] | None = None) -> Path | None:
    """Find the address file the daemon configured by ``env`` writes (None: no checkpoint.dir).

    ``rest.address_file``, else ``<checkpoint.dir>/daemon.json``, read from the
    ``AIOSTREAM_*`` environment as the daemon reads it: in a container both are
    set there, so the HEALTHCHECK finds the daemon whatever port it listens on.
    """
    from aiostream_ckpt.daemon.address import ADDRESS_FILE
    from aiostream_ckpt.daemon.config import load_config

    loaded = load_config(env=os.environ if env is None else env)
    if loaded.daemon.address_file is not None:
        return loaded.daemon.address_file
    directory = loaded.job.checkpoint_dir()
    return directory / ADDRESS_FILE if directory is not None else None


def health_main(args: argparse.Namespace) -> int:
    """0 when the daemon is healthy (HEALTHCHECK contract), else 1.

    Healthy: ``/health`` answers 200 within the timeout, at the URL given with
    ``--url`` or published in the daemon's address file; with ``rest.enabled=false``
    the daemon process being alive is all that can be checked. Without an address
    file to read (no checkpoint.dir in the environment) it asks
    ``127.0.0.1:$AIOSTREAM_REST__PORT``.
    """
    from aiostream_ckpt.daemon import address
    from aiostream_ckpt.errors import ConfigError

    url = args.url
    if url is None:
        try:
            path = args.address_file or daemon_address_file()
        except ConfigError as exc:
            print(f"unhealthy: {exc}", file=sys.stderr)
            return 1
        if path is None:
            url = default_url()
        else:
            try:
                found = address.read(path)
            except (OSError, ValueError) as exc:
                print(f"unhealthy: no daemon address in {path} ({exc})", file=sys.stderr)
                return 1
            if not address.is_daemon_alive(found.pid):
                print(
                    f"unhealthy: daemon pid {found.pid} of {path} is not running", file=sys.stderr
                )
                return 1
            url = found.url
            if url is None:
                print(orjson.dumps({"status": "ok", "pid": found.pid, "rest": False}).decode())
                return 0
    url = url.rstrip("/")
    try:
        status, answer = request("GET", url + "/health", timeout=args.timeout)
    except OSError as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    print(orjson.dumps(answer).decode() if isinstance(answer, dict) else answer)
    return 0 if status == 200 else 1
