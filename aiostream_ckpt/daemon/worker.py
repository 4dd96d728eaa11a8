"""The entry point of a worker process (started by ``runtime.workers.WorkerProcess``).

It builds the job from the app module and the main process's config
sources, as ``aiostream-ckpt run`` does, says hello on its control
connection with the graph's fingerprint and its share of the tasks, and
serves until told to stop; the end of the control connection (the main
process is gone) ends it too.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Any

import uvloop

from aiostream_ckpt.api.environment import StreamEnvironment
from aiostream_ckpt.daemon.app_loader import app_name, build_app
from aiostream_ckpt.daemon.config import load_config
from aiostream_ckpt.errors import AiostreamError, ChannelError
from aiostream_ckpt.runtime.graph import plan_chains
from aiostream_ckpt.runtime.placement import graph_fingerprint, worker_tasks
from aiostream_ckpt.runtime.remote import ChannelConnection
from aiostream_ckpt.runtime.wire import batch_codec
from aiostream_ckpt.runtime.workers import die_with_parent


def build_hello(module: str, config: Path | None, sets: list[str], index: int, workers: int) -> Any:
    """Build the job as the main process does; return the hello that describes it."""
    loaded = load_config(config, env=os.environ, sets=sets)
    env = StreamEnvironment(
        loaded.job_name or app_name(module), config=loaded.job, params=loaded.params
    )
    build_app(module, env)
    spec = env.spec()
    chains = plan_chains(spec.transformations, spec.config)
    return {
        "type": "hello",
        "worker": index,
        "pid": os.getpid(),
        "fingerprint": graph_fingerprint(spec.transformations),
        "tasks": worker_tasks([(c.head.uid, c.parallelism) for c in chains], index, workers),
    }


async def serve(control_fd: int, hello: dict[str, Any]) -> int:
    conn = ChannelConnection(f"worker-{hello.get('worker')}-control", batch_codec())
    await conn.start(socket.socket(fileno=control_fd))
    conn.send_message(hello)
    if hello["type"] == "error":
        await conn.close()
        return 1
    try:
        while True:
            message = await conn.receive_message()
            if message.get("type") == "stop":
                await conn.close()
                return 0
    except ChannelError as exc:  # the main process is gone: nobody to work for
        print(f"worker {hello['worker']}: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="aiostream-ckpt worker")
    ap.add_argument("module")
    ap.add_argument("--index", type=int, required=True)
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--control-fd", type=int, required=True)
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--config", type=Path)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args(argv)
    die_with_parent(args.parent)
    try:
        hello = build_hello(args.module, args.config, args.sets, args.index, args.workers)
    except AiostreamError as exc:
        hello = {"type": "error", "worker": args.index, "message": str(exc)}
    code: int = uvloop.run(serve(args.control_fd, hello))
    return code


if __name__ == "__main__":
    sys.exit(main())
