"""``aiostream-ckpt broker start|stop|status``: a local broker that outlives the command.

The broker runs detached; its pid, ports and data dir are kept in a state
file under ``cache_root()/broker``, so ``stop`` and ``status`` find it again
and a new ``start`` reuses the last ports while they are free.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

from aiostream_ckpt.errors import ConfigError, ConnectorError
from aiostream_ckpt_dev.broker.jars import KAFKA_VERSION
from aiostream_ckpt_dev.broker.process import LOOPBACK, KafkaBroker
from aiostream_ckpt_dev.maven import cache_root


def _state_path() -> Path:
    return cache_root() / "broker" / "state.json"


def _read_state() -> dict[str, object] | None:
    try:
        state = json.loads(_state_path().read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Like Java's server sockets, so TIME_WAIT leftovers don't count as taken.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _is_our_broker(pid: int, data_dir: str) -> bool:
    """Tell whether ``pid`` is still the broker we started (pids get reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"kafka.Kafka" in cmdline and any(data_dir.encode() in arg for arg in cmdline)


def _running_state() -> dict[str, object] | None:
    state = _read_state()
    if state is None:
        return None
    pid, data_dir = state.get("pid"), state.get("data_dir")
    if isinstance(pid, int) and isinstance(data_dir, str) and _is_our_broker(pid, data_dir):
        return state
    return None


def broker_main(argv: list[str]) -> int:
    """Run ``aiostream-ckpt broker start|stop|status``; return the exit code.

    ``start`` runs a detached broker whose data and ports survive
    ``stop``/``start`` (``--fresh`` wipes the data). The state file (pid,
    bootstrap, log) lives in ``cache_root()/broker``. ``status`` exits 0 if
    running, 3 if not (the LSB convention).
    """
    parser = argparse.ArgumentParser(prog="aiostream-ckpt broker")
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start", help="start a local Kafka broker in the background")
    p_start.add_argument("--port", type=int, help="broker port (default: a free one)")
    p_start.add_argument("--fresh", action="store_true", help="wipe topics and data first")
    p_start.add_argument("--timeout", type=float, default=300.0, help="seconds to wait")
    sub.add_parser("stop", help="stop the background broker")
    sub.add_parser("status", help="print the bootstrap address if running")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            return _cli_start(args.port, fresh=args.fresh, timeout_s=args.timeout)
        if args.command == "stop":
            return _cli_stop()
        return _cli_status()
    except (ConfigError, ConnectorError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _cli_start(port: int | None, *, fresh: bool, timeout_s: float) -> int:
    running = _running_state()
    if running is not None:
        print(f"already running (pid {running['pid']})", file=sys.stderr)
        print(running["bootstrap_servers"])
        return 0
    data_dir = cache_root() / "broker" / "data"
    if fresh:
        shutil.rmtree(data_dir, ignore_errors=True)
    # Reuse the last ports when free, so clients configured for the previous
    # run find the broker again.
    last = _read_state() or {}
    last_port, last_controller = last.get("port"), last.get("controller_port")
    controller_port = None
    if (
        port is None
        and isinstance(last_port, int)
        and isinstance(last_controller, int)
        and _port_free(last_port)
        and _port_free(last_controller)
    ):
        port, controller_port = last_port, last_controller
    broker = KafkaBroker(
        data_dir,
        port=port,
        controller_port=controller_port,
        detach=True,
        start_timeout_s=timeout_s,
    )
    broker.start()
    state = {
        "pid": broker.pid,
        "bootstrap_servers": broker.bootstrap_servers,
        "port": broker.port,
        "controller_port": broker.controller_port,
        "data_dir": str(broker.data_dir),
        "log_path": str(broker.log_path),
        "kafka_version": KAFKA_VERSION,
    }
    tmp = _state_path().with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(_state_path())
    print(broker.bootstrap_servers)
    return 0


def _cli_stop(timeout_s: float = 30.0) -> int:
    state = _running_state()
    if state is None:
        print("not running", file=sys.stderr)
        return 0
    pid = state["pid"]
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _is_our_broker(pid, str(state["data_dir"])) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _is_our_broker(pid, str(state["data_dir"])):
        os.kill(pid, signal.SIGKILL)
    print(f"stopped (pid {pid})", file=sys.stderr)
    return 0


def _cli_status() -> int:
    state = _running_state()
    if state is None:
        print("not running")
        return 3
    print(f"{state['bootstrap_servers']} (pid {state['pid']}, log {state['log_path']})")
    return 0


if __name__ == "__main__":
    sys.exit(broker_main(sys.argv[1:]))
