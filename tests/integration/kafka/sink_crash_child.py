"""Child process for the sink recovery tests: run P writers to a checkpoint, then hang for kill -9.

Usage: python sink_crash_child.py CONFIG_JSON

CONFIG_JSON: ``{"bootstrap", "topic", "prefix", "parallelism", "restored" (a
merged state or null), "timeout_ms", "checkpoints" (how many to complete and
commit before the last one, whose commit never runs), "open_tag"}``. Each subtask writes
records tagged ``c{n}`` per checkpoint n, then opens one more transaction
(tag ``open``). The child prints the writer states of the last checkpoint as
one JSON line, then waits to be SIGKILLed: that checkpoint is complete, its
transactions pre-committed, and one transaction per subtask is open.
"""

from __future__ import annotations

import asyncio
import json
import sys


async def _main(cfg: dict) -> None:
    from aiostream_ckpt.connectors.base import ConnectorContext
    from aiostream_ckpt.connectors.kafka.sink import KafkaSink

    sink = KafkaSink(
        cfg["topic"],
        cfg["bootstrap"],
        transactional_id_prefix=cfg["prefix"],
        transaction_timeout_ms=cfg.get("timeout_ms", 120_000),
        hold_batches=False,  # the open transactions' records go to the broker at once
    )
    p = cfg["parallelism"]
    writers = [sink.create_writer(ConnectorContext("job", "sink", k, p)) for k in range(p)]
    first = cfg.get("first_checkpoint", 1)
    await asyncio.gather(*(w.recover(cfg["restored"], first - 1 or None) for w in writers))
    states: list = []
    last = first + cfg.get("checkpoints", 1) - 1
    for n in range(first, last + 1):
        for k, w in enumerate(writers):
            await w.write([{"k": f"key-{i}", "tag": f"c{n}", "sub": k, "i": i} for i in range(5)])
        states = [await w.prepare_commit(n) for w in writers]
        if n < last:
            for w in writers:
                await w.commit(n)
    for k, w in enumerate(writers):
        tag = cfg.get("open_tag", "open")
        await w.write([{"k": f"key-{i}", "tag": tag, "sub": k, "i": i} for i in range(3)])
    print(json.dumps(states), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_main(json.loads(sys.argv[1])))
