"""The Kafka-path ceiling: a bare aiokafka consume -> count -> transactional produce loop.

Usage: python bare_aiokafka.py BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC INTERVAL_S INPUT_PARTITIONS

Exactly-once the Kafka way, with nothing else: one consumer assigned every
input partition (read_committed), counts in a dict, updates built straight
into per-partition record batches (keyed by app_id, Kafka's default
partitioner), and one transaction per INTERVAL_S carrying the consumed
offsets (send_offsets_to_transaction). No state backend, no checkpoint of
the counts: a crash would restart the counts from zero, so this is a ceiling
for the Kafka I/O and the transactions, not a fault-tolerant job. Ends when
it has read up to the input's end offsets seen at start.
"""

import asyncio
import sys
import time

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner


async def run(
    bootstrap: str, in_topic: str, out_topic: str, interval: float, partitions: int
) -> None:
    group = f"bare-{out_topic}"
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        group_id=group,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=group,
        acks="all",
        max_batch_size=512 * 1024,
    )
    await consumer.start()
    await producer.start()
    try:
        tps = [TopicPartition(in_topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        out_parts = sorted(await producer.partitions_for(out_topic))
        partitioner = DefaultPartitioner()
        part_of: dict[bytes, int] = {}
        counts: dict[str, int] = {}
        loads, dumps = orjson.loads, orjson.dumps
        positions = {tp: 0 for tp in tps}
        print(f"bare-aiokafka: reading {sum(end.values())} records", file=sys.stderr, flush=True)
        await producer.begin_transaction()
        last_commit = time.monotonic()
        done = all(end[tp] == 0 for tp in tps)
        while not done:
            data = await consumer.getmany(timeout_ms=100, max_records=2048)
            builders = {}
            for tp, records in data.items():
                positions[tp] = records[-1].offset + 1
                for r in records:
                    key = loads(r.value)["app_id"]
                    n = counts.get(key, 0) + 1
                    counts[key] = n
                    kb = key.encode()
                    p = part_of.get(kb)
                    if p is None:
                        p = part_of[kb] = partitioner(kb, out_parts, out_parts)
                    b = builders.get(p)
                    if b is None:
                        b = builders[p] = producer.create_batch()
                    v = dumps({"app_id": key, "pv": n})
                    if b.append(timestamp=None, key=kb, value=v) is None:
                        await producer.send_batch(b, out_topic, partition=p)
                        b = builders[p] = producer.create_batch()
                        b.append(timestamp=None, key=kb, value=v)
            for p, b in builders.items():
                await producer.send_batch(b, out_topic, partition=p)
            done = all(positions[tp] >= end[tp] for tp in tps)
            if done or time.monotonic() - last_commit >= interval:
                await producer.send_offsets_to_transaction(positions, group)
                await producer.commit_transaction()
                last_commit = time.monotonic()
                if not done:
                    await producer.begin_transaction()
        print(f"bare-aiokafka: finished ({sum(counts.values())} events)", file=sys.stderr,
              flush=True)
    finally:
        await producer.stop()
        await consumer.stop()


def main() -> None:
    bootstrap, in_topic, out_topic = sys.argv[1:4]
    interval = float(sys.argv[4])
    partitions = int(sys.argv[5])
    coro = run(bootstrap, in_topic, out_topic, interval, partitions)
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


if __name__ == "__main__":
    main()
