"""Child process for the crash tests: pre-commit a transaction, then hang until SIGKILLed.

Usage: python txn_crash_child.py BOOTSTRAP TOPIC TRANSACTIONAL_ID N PARTITIONS TIMEOUT_MS

Prints the prepared transaction (id, producer id, epoch) as one JSON line
after ``flush()``, like a sink pre-committing at a barrier. The parent then
kills it, so no EndTxn and no clean shutdown ever happen.
"""

from __future__ import annotations

import asyncio
import json
import sys


async def _main(
    bootstrap: str, topic: str, txn_id: str, n: int, partitions: int, timeout_ms: int
) -> None:
    from aiokafka import AIOKafkaProducer

    from aiostream_ckpt.connectors.kafka.transactions import prepared_transaction

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=txn_id,
        transaction_timeout_ms=timeout_ms,
    )
    await producer.start()
    await producer.begin_transaction()
    for i in range(n):
        await producer.send(topic, f"{txn_id}:{i}".encode(), partition=i % partitions)
    await producer.flush()
    print(json.dumps(prepared_transaction(producer)._asdict()), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    bootstrap, topic, txn_id, n, partitions, timeout_ms = sys.argv[1:7]
    asyncio.run(_main(bootstrap, topic, txn_id, int(n), int(partitions), int(timeout_ms)))
