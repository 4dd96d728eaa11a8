"""The per-record cost of a channel hop to another process, against one inside a process.

``python -m bench.xchannel [--records N] [--batch 64 512] [--serializer json json-trusted pickle]``
sends ``N`` pv_count-like records (``{"app_id", "user", "ts", "page"}``) in
batches from a producer task to a consumer that takes them from an
:class:`~aiostream_ckpt.runtime.channels.InputGate`, and prints, per batch
size and serializer: microseconds per record (wall) and CPU seconds per
million records (producer and consumer process together). Rows:

* ``in-process``: today's hop, an ``asyncio.Queue`` in one uvloop loop;
* ``cross-process``: a :class:`~aiostream_ckpt.runtime.network.remote.ChannelConnection`
  over a socket pair to a child process on its own uvloop loop (window 8).

The difference is what a record pays for crossing a process: encoding (with
the JSON codec's exactness check), the socket, decoding. ``json-trusted`` is
the JSON codec on a channel the graph trusts (records straight from an exact
source): no exactness check.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import subprocess
import sys
import time
from typing import Any

import uvloop

from aiostream_ckpt.runtime.channels import InputGate
from aiostream_ckpt.runtime.elements import END_OF_INPUT
from aiostream_ckpt.runtime.network.remote import ChannelConnection
from aiostream_ckpt.runtime.wire import batch_codec

WINDOW = 8


def make_batches(records: int, batch: int) -> list[list[dict[str, Any]]]:
    recs = [
        {
            "app_id": f"app-{i % 10_000}",
            "user": f"u{i % 977}",
            "ts": 1_700_000_000_000 + i,
            "page": "/p",
        }
        for i in range(batch)
    ]
    return [[dict(r) for r in recs] for _ in range(records // batch)]


def cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def consume(gate: InputGate) -> int:
    n = 0
    get = gate.queue.get
    while True:
        _, element = await get()
        if element is END_OF_INPUT:
            return n
        n += len(element)


async def in_process(batches: list[list[Any]]) -> tuple[float, float]:
    gate = InputGate(1, WINDOW)
    w = gate.writer(0)
    cpu, wall = cpu_self(), time.perf_counter()
    consumer = asyncio.create_task(consume(gate))
    for b in batches:
        await w.send(b)
    await w.send(END_OF_INPUT)
    await consumer
    return time.perf_counter() - wall, cpu_self() - cpu


async def cross_process(batches: list[list[Any]], serializer: str) -> tuple[float, float]:
    parent, child = socket.socketpair()
    proc = subprocess.Popen(  # noqa: ASYNC220 (started once, before the clock runs)
        [sys.executable, "-m", "bench.xchannel", "--child", str(child.fileno()), serializer],
        pass_fds=(child.fileno(),),
        stdout=subprocess.PIPE,
    )
    child.close()
    assert proc.stdout is not None
    codec = batch_codec(serializer.removesuffix("-trusted"))
    conn = ChannelConnection("bench", codec, window=WINDOW)
    w = conn.writer(0, trusted=serializer.endswith("-trusted"))
    await conn.start(parent)
    cpu, wall = cpu_self(), time.perf_counter()
    for b in batches:
        await w.send(b)
    await w.send(END_OF_INPUT)
    line = await asyncio.to_thread(proc.stdout.readline)  # the child's count and CPU
    elapsed, own = time.perf_counter() - wall, cpu_self() - cpu
    await conn.close()
    proc.wait()
    n, child_cpu = line.split()
    assert int(n) == sum(map(len, batches)), line
    return elapsed, own + float(child_cpu)


def child_main(fd: int, serializer: str) -> None:
    async def main() -> None:
        gate = InputGate(1, WINDOW)
        codec = batch_codec(serializer.removesuffix("-trusted"))
        conn = ChannelConnection("bench-child", codec, window=WINDOW)
        conn.reader(0, gate, index=0)
        await conn.start(socket.socket(fileno=fd))
        cpu = cpu_self()
        consumer = asyncio.ensure_future(consume(gate))
        await asyncio.wait({consumer, conn.failure}, return_when=asyncio.FIRST_COMPLETED)
        if conn.failure.done():
            raise conn.failure.result()
        print(consumer.result(), cpu_self() - cpu, flush=True)
        await conn.wait_closed()  # the parent's goodbye

    uvloop.run(main())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_024_000)
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--serializer", nargs="+", default=["json"])
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child_main(int(args.child[0]), args.child[1])
        return
    print(f"{'row':28s} {'batch':>5s} {'us/record':>10s} {'CPU s/M records':>16s}")
    for batch in args.batch:
        batches = make_batches(args.records, batch)
        n = sum(map(len, batches)) / 1e6
        rows = [("in-process", lambda b=batches: in_process(b))]
        for ser in args.serializer:
            rows.append((f"cross-process {ser}", lambda b=batches, s=ser: cross_process(b, s)))
        for name, run in rows:
            wall, cpu = uvloop.run(run())
            print(f"{name:28s} {batch:5d} {wall / n:10.3f} {cpu / n:16.2f}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
