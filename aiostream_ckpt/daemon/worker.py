"""The entry point of a worker process (started by ``runtime.workers.worker_process``).

It builds the job from the app module and the main process's config
sources, as ``aiostream-ckpt run`` does, says hello on its control
connection with the graph's fingerprint and its share of the tasks, then
runs its share of one attempt (``runtime.workers.worker_attempt``) until told to
stop; the end of the control connection (the main process is gone) ends it
too. From its hello on it sends heartbeats (``runtime.workers.heartbeats``).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Any

import uvloop

from aiostream_ckpt import failpoints
from aiostream_ckpt.api.environment import StreamEnvironment
from aiostream_ckpt.clock import SystemClock
from aiostream_ckpt.daemon.app_loader import app_name, build_app
from aiostream_ckpt.daemon.config import load_config
from aiostream_ckpt.daemon.logs import setup_logging
from aiostream_ckpt.errors import AiostreamError, ChannelError
from aiostream_ckpt.jobspec.graph import JobSpec
from aiostream_ckpt.runtime.graph import Chain, plan_chains
from aiostream_ckpt.runtime.network.placement import graph_fingerprint, worker_tasks
from aiostream_ckpt.runtime.network.remote import ChannelConnection
from aiostream_ckpt.runtime.process import apply_process_profile
from aiostream_ckpt.runtime.wire import batch_codec
from aiostream_ckpt.runtime.workers.heartbeats import HeartbeatSender
from aiostream_ckpt.runtime.workers.worker_attempt import serve_attempt
from aiostream_ckpt.runtime.workers.worker_process import die_with_parent


def build_job(module: str, config: Path | None, sets: list[str]) -> JobSpec:
    """Build the job spec as the main process does (``aiostream-ckpt run``).

    The process is set up as the main one too: its logging, and its process
    profile (``docs/performance.md``), which the job runner applies in the
    main process only; the workers run the tasks, the hot path it is for.
    """
    loaded = load_config(config, env=os.environ, sets=sets)
    setup_logging(loaded.log_format, loaded.log_level)
    apply_process_profile(loaded.daemon.process_profile())
    env = StreamEnvironment(
        loaded.job_name or app_name(module), config=loaded.job, params=loaded.params
    )
    build_app(module, env)
    return env.spec()


def hello(spec: JobSpec, chains: list[Chain], index: int, workers: int) -> dict[str, Any]:
    """Return what the main process checks before anything runs: the graph, this worker's tasks."""
    return {
        "type": "hello",
        "worker": index,
        "pid": os.getpid(),
        "fingerprint": graph_fingerprint(spec.transformations),
        "tasks": worker_tasks([(c.head.uid, c.parallelism) for c in chains], index, workers),
    }


async def serve(
    control_fd: int,
    built: tuple[JobSpec, list[Chain]] | str,
    index: int,
    workers: int,
    peer_fds: dict[int, int],
) -> int:
    """Say hello (or why the job could not be built), then serve one attempt."""
    conn = ChannelConnection(f"worker-{index}-control", batch_codec())
    await conn.start(socket.socket(fileno=control_fd))
    peers = {j: socket.socket(fileno=fd) for j, fd in peer_fds.items()}
    try:
        if isinstance(built, str):
            conn.send_message({"type": "error", "worker": index, "message": built})
            return 1
        spec, chains = built
        conn.send_message(hello(spec, chains, index, workers))
        async with HeartbeatSender(conn, spec.config.heartbeat_interval, SystemClock()):
            return await serve_attempt(conn, spec, chains, (index, workers), peers)
    except ChannelError as exc:  # the main process is gone: nobody to work for
        print(f"worker {index}: {exc}", file=sys.stderr)
        return 1
    finally:
        for sock in peers.values():
            if sock.fileno() != -1:
                sock.close()
        await conn.close()


def _peer(value: str) -> tuple[int, int]:
    worker, _, fd = value.partition(":")
    return int(worker), int(fd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="aiostream-ckpt worker")
    ap.add_argument("module")
    ap.add_argument("--index", type=int, required=True)
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--control-fd", type=int, required=True)
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--config", type=Path)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--peer", dest="peers", action="append", default=[], type=_peer)
    args = ap.parse_args(argv)
    die_with_parent(args.parent)
    built: tuple[JobSpec, list[Chain]] | str
    try:
        failpoints.arm_from_env()  # the main process passes them to its first attempt only
        spec = build_job(args.module, args.config, args.sets)
        built = spec, plan_chains(spec.transformations, spec.config)
    except AiostreamError as exc:
        built = str(exc)
    code: int = uvloop.run(
        serve(args.control_fd, built, args.index, args.workers, dict(args.peers))
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
