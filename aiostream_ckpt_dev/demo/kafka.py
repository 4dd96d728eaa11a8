"""``aiostream-ckpt demo-kafka``: pv_count Kafka to Kafka under SIGKILL, proven exactly-once.

1. Start a local Kafka broker (the real one, :class:`KafkaBroker`), create
   the input and output topics, and load the generated events into the input.
2. Run ``aiostream-ckpt run apps.pv_count`` in Kafka mode (exactly-once sink,
   1 s checkpoints, bounded by the input's end offsets) as a worker process;
   SIGKILL it at random moments and start it again on the same checkpoints.
3. Read the output topic with ``read_committed`` and compare with a recount of
   the input: every key's updates are exactly ``1..n`` in order, ``n`` its
   input count. With Spark (``aiostream_ckpt_dev.validate``) when it runs here,
   else in Python; the output says which. Then prove the topic the general
   way (``validate --app``): two failure-free runs of pv_count into topics of
   their own, compared with it as a ``read_committed`` consumer sees them.
4. Prove the windowed app (``apps.sessions``, Kafka to Kafka) under kill -9
   against a failure-free run (:mod:`.windowed`).
5. Stop the broker, also on failure.

``--format avro``: the events and the counts are Avro in the Confluent wire
format behind a schema registry (the stand-in of
:mod:`aiostream_ckpt_dev.schema_registry`, on loopback: no real registry
installs here); the checks decode the output with their own reader
(:mod:`aiostream_ckpt_dev.validate.confluent_avro`), the Spark check is left
out. ``--security ssl|sasl_ssl|sasl_plaintext``: pv_count speaks only that
listener of the broker (``KafkaBroker(secure=True)``), configured by the
``kafka.*`` keys, the password from ``AIOSTREAM_KAFKA__SASL_PASSWORD``; the
demo's own loading and checking stay on PLAINTEXT.

The loading and checking helpers are used by the Kafka tests too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from aiostream_ckpt.connectors.generator import write_generated_jsonl
from aiostream_ckpt.connectors.kafka.common import bootstrap_client, require_topics
from aiostream_ckpt.connectors.key_grouped import KeyGroupPartitioner
from aiostream_ckpt.keygroups import DEFAULT_MAX_PARALLELISM
from aiostream_ckpt_dev.demo.files import run_demo_worker
from aiostream_ckpt_dev.demo.windowed import prove_windowed, verified_line
from aiostream_ckpt_dev.recount import check_pv_updates, recount_inputs

_LOAD_BLOCK = 4 << 20
_LOAD_BATCH_LINES = 4000


# -- helpers shared with the tests ----------------------------------------------------


async def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    """Create ``{name: partitions}`` topics (replication 1)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(t, num_partitions=n, replication_factor=1) for t, n in topics.items()]
        )
    finally:
        await admin.close()
    await wait_for_leaders(bootstrap, list(topics))


async def wait_for_leaders(bootstrap: str, topics: list[str]) -> None:
    """Return once the broker's metadata lists every partition of ``topics`` with a leader.

    Why: CreateTopics answers once the controller has the topic, and the broker
    applies it to the metadata it serves a moment later: a reader or writer
    started in between finds no such topic (a CI run's sink test did), and
    producing before the partitions have leaders only earns retry warnings.
    Gives up silently after 30 s (what then fails names the topic).
    """
    client = await bootstrap_client(bootstrap, {}, timeout_s=30, what="topic leaders")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            cluster = await client.fetch_all_metadata()
            if all(
                cluster.partitions_for_topic(t)
                and all(
                    (cluster.leader_for_partition(TopicPartition(t, p)) or -1) >= 0
                    for p in cluster.partitions_for_topic(t)
                )
                for t in topics
            ):
                return
            await asyncio.sleep(0.02)
    finally:
        await client.close()


def _line_chunks(path: Path) -> Iterator[list[bytes]]:
    carry = b""
    with open(path, "rb") as f:
        while block := f.read(_LOAD_BLOCK):
            lines = (carry + block).split(b"\n")
            carry = lines.pop()
            for i in range(0, len(lines), _LOAD_BATCH_LINES):
                yield [ln for ln in lines[i : i + _LOAD_BATCH_LINES] if ln.strip()]
    if carry.strip():
        yield [carry]


async def send_lines(
    producer: AIOKafkaProducer, topic: str, partition: int, lines: list[bytes]
) -> list[Any]:
    """Send ``lines`` as records (no key) into one partition in full batches; their futures."""
    futures = []
    batch = producer.create_batch()
    for line in lines:
        if batch.append(timestamp=None, key=None, value=line) is None:
            futures.append(await producer.send_batch(batch, topic, partition=partition))
            batch = producer.create_batch()
            batch.append(timestamp=None, key=None, value=line)
    futures.append(await producer.send_batch(batch, topic, partition=partition))
    return futures


async def load_jsonl(
    bootstrap: str,
    topic: str,
    path: Path,
    *,
    key_grouped: Callable[[Any], Any] | None = None,
    max_parallelism: int = DEFAULT_MAX_PARALLELISM,
) -> int:
    """Produce every line of ``path`` as one record, batches dealt round-robin over partitions.

    Batches are built directly (``create_batch``/``send_batch``): per-record
    ``send()`` costs a coroutine and a future per event. ``key_grouped`` (the
    consuming job's key selector, applied to each parsed line) places each
    line by key group instead, as ``KafkaSink(partitioner=KeyGroupPartitioner(key))``
    would: a ``KafkaSource(key_grouped=True)`` (and sharded jobs) then read
    the topic; a line that does not parse or key goes to partition 0.
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", max_batch_size=1 << 20, linger_ms=5
    )
    await producer.start()
    sent = 0
    try:
        partitions = sorted(await producer.partitions_for(topic))
        futures = []
        for i, lines in enumerate(_line_chunks(path)):
            if key_grouped is None:
                p = partitions[i % len(partitions)]
                futures += await send_lines(producer, topic, p, lines)
            else:
                place = KeyGroupPartitioner(key_grouped, max_parallelism)
                by_partition: dict[int, list[bytes]] = {}
                for line in lines:
                    try:
                        j = place.partition_of_key(key_grouped(orjson.loads(line)), len(partitions))
                    except Exception:  # malformed: the job dead-letters it wherever it is
                        j = 0
                    by_partition.setdefault(partitions[j], []).append(line)
                for p, part in sorted(by_partition.items()):
                    futures += await send_lines(producer, topic, p, part)
            sent += len(lines)
        await producer.flush()
        for fut in futures:
            fut.result()
    finally:
        await producer.stop()
    return sent


async def read_topic_values(
    bootstrap: str, topic: str, *, isolation_level: str = "read_committed", timeout_s: float = 120
) -> list[bytes]:
    """All values of ``topic`` up to its end offsets now, partition by partition, in order."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation_level,
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 << 20,
    )
    await consumer.start()
    try:
        client = await bootstrap_client(bootstrap, {}, timeout_s=30, what="read topic")
        try:
            parts = (await require_topics(client, [topic], bootstrap_servers=bootstrap))[topic]
        finally:
            await client.close()
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        got: dict[TopicPartition, list[bytes]] = {tp: [] for tp in tps}

        async def drain() -> None:
            active = [tp for tp in tps if end[tp] > 0]
            while active:
                batch = await consumer.getmany(*active, timeout_ms=200, max_records=50_000)
                for tp, records in batch.items():
                    got[tp].extend(r.value for r in records if r.offset < end[tp])
                active = [tp for tp in active if await consumer.position(tp) < end[tp]]

        await asyncio.wait_for(drain(), timeout_s)
        return [v for tp in tps for v in got[tp]]
    finally:
        await consumer.stop()


def worker_flags() -> list[str]:
    """CLI flags for worker processes: no REST listener (workers, tests and demos run side by side).

    Only when this build has the REST API (``rest.*`` keys): an unknown key is an error.
    """
    try:
        from aiostream_ckpt.daemon.settings import DAEMON_KEYS
    except ImportError:
        return []
    return ["--set", "rest.enabled=false"] if "rest.enabled" in DAEMON_KEYS else []


# -- the demo -------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="aiostream-ckpt demo-kafka", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--partitions", type=int, default=4, help="input and output partitions")
    p.add_argument("--kills", type=int, default=2)
    p.add_argument("--seed", type=int, default=None, help="default: random")
    p.add_argument("--workdir", type=Path, default=Path(".demo") / "kafka")
    p.add_argument("--interval", default="1s", help="checkpoint interval")
    p.add_argument("--parallelism", type=int, default=1)
    p.add_argument("--no-spark", action="store_true", help="verify in Python only")
    p.add_argument(
        "--no-proof",
        dest="proof",
        action="store_false",
        help="skip the reference-run proof of the output topic",
    )
    p.add_argument(
        "--windowed-kills", type=int, default=2, help="kills for the windowed app (0: skip it)"
    )
    p.add_argument(
        "--format", choices=("json", "avro"), default="json", help="pv_count's record format"
    )
    p.add_argument(
        "--security",
        choices=("plaintext", "ssl", "sasl_ssl", "sasl_plaintext"),
        default="plaintext",
        help="the broker listener pv_count speaks (TLS, SASL)",
    )
    p.add_argument("--sasl-mechanism", choices=("SCRAM-SHA-512", "PLAIN"), default="SCRAM-SHA-512")
    return p


def security_sets(broker: Any, protocol: str, mechanism: str) -> list[str]:
    """``--set`` values making pv_count speak ``protocol``; the password goes to the env."""
    from aiostream_ckpt_dev.broker.security import USERS

    sets = [f"kafka.security_protocol={protocol}"]
    if protocol.startswith("SASL_"):
        sets += [f"kafka.sasl_mechanism={mechanism}", "kafka.sasl_username=alice"]
        os.environ["AIOSTREAM_KAFKA__SASL_PASSWORD"] = USERS["alice"]  # the workers inherit it
    if protocol.endswith("SSL"):
        sets.append(f"kafka.ssl_cafile={broker.certificates.ca_file}")
    return sets


async def load_avro(bootstrap: str, topic: str, path: Path, registry_url: str) -> int:
    """Produce each line of ``path`` as an Avro ``PageView`` (Confluent wire format).

    A line that is not an event with a string ``app_id`` is produced as it is
    (not framed): the job dead-letters it, as the JSON demo's malformed lines.
    """
    from aiostream_ckpt.connectors.kafka.formats import AvroFormat, SchemaRegistry
    from aiostream_ckpt.daemon.app_loader import import_app

    schema = import_app("apps.pv_count").PAGE_VIEW_SCHEMA  # the app's (the working directory's)
    fmt = AvroFormat(SchemaRegistry(registry_url), schema)
    async with fmt.registry.client() as client:
        encode = await fmt.encoder(client, topic, is_key=False)
    fields = [f["name"] for f in schema["fields"]]

    def avro(line: bytes) -> bytes:
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            return line
        if not isinstance(event, dict) or not isinstance(event.get("app_id"), str):
            return line
        return encode({f: event.get(f) for f in fields})

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", max_batch_size=1 << 20, linger_ms=5
    )
    await producer.start()
    sent = 0
    try:
        partitions = sorted(await producer.partitions_for(topic))
        futures = []
        for i, lines in enumerate(_line_chunks(path)):
            p = partitions[i % len(partitions)]
            futures += await send_lines(producer, topic, p, [avro(ln) for ln in lines])
            sent += len(lines)
        await producer.flush()
        for fut in futures:
            fut.result()
    finally:
        await producer.stop()
    return sent


def _spark_check(work: Path, inputs: Path, bootstrap: str, topic: str) -> tuple[bool, str] | None:
    """Run the Spark validator in a child process; None when it can't run here.

    A child, so the JVM's own output goes to a log file instead of the terminal.
    """
    try:
        import pyspark  # noqa: F401

        import aiostream_ckpt_dev.validate  # noqa: F401
    except ImportError as exc:
        print(f"demo-kafka: Spark validator not available ({exc}); Python check only")
        return None
    cmd = [sys.executable, "-m", "aiostream_ckpt_dev.validate", "--check", "pv_count"]
    cmd += ["--input", str(inputs), "--kafka-bootstrap", bootstrap, "--kafka-topic", topic]
    cmd += ["--json", str(work / "validation.json")]
    log = work / "spark.log"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    except subprocess.TimeoutExpired:
        print("demo-kafka: Spark validator timed out; Python check only")
        return None
    log.write_text(proc.stdout + proc.stderr)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    last = lines[-1] if lines else (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    if proc.returncode in (0, 1):
        return proc.returncode == 0, last
    print(f"demo-kafka: Spark validator could not run ({last}; see {log}); Python check only")
    return None


def _reference_proof(work: Path, sets: list[str]) -> bool:
    """Prove the output topic the general way: failure-free runs, compared read_committed."""
    from aiostream_ckpt_dev.validate.proof import AppRun, load_contract
    from aiostream_ckpt_dev.validate.proof_cli import drop_reference, prove
    from aiostream_ckpt_dev.validate.result import print_report

    print("demo-kafka: proving the output topic against a failure-free run (read_committed)")
    scratch = work / "proof"
    try:
        report = prove(AppRun("apps.pv_count", sets), load_contract("apps.pv_count"), scratch)
    finally:
        drop_reference(scratch)
    print_report(report, work / "proof.json")
    return report.passed


def demo_kafka_main(argv: list[str]) -> int:
    from aiostream_ckpt_dev.broker import KafkaBroker

    args = _parser().parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    work: Path = args.workdir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    inputs = work / "events.jsonl"
    print(f"demo-kafka: generating {args.events:,} events over {args.keys:,} app_ids (seed {seed})")
    write_generated_jsonl(inputs, args.events, seed=seed, keys=args.keys)
    print("demo-kafka: starting the local Kafka broker", flush=True)
    secure = args.security != "plaintext"
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(
            KafkaBroker(work / "broker", start_timeout_s=300, secure=secure)
        )
        registry = None
        if args.format == "avro":
            from aiostream_ckpt_dev.schema_registry import SchemaRegistryStandIn

            registry = stack.enter_context(SchemaRegistryStandIn()).url
            print(f"demo-kafka: Avro values; stand-in schema registry at {registry}")
        job_bootstrap, job_sets = broker.bootstrap_servers, []
        if secure:
            protocol = args.security.upper()
            job_bootstrap = broker.listener(protocol)
            job_sets = security_sets(broker, protocol, args.sasl_mechanism)
            mechanism = f" {args.sasl_mechanism}" if protocol.startswith("SASL_") else ""
            print(f"demo-kafka: pv_count speaks {protocol}{mechanism} at {job_bootstrap}")
        return _run(
            args, seed, work, inputs, broker.bootstrap_servers, job_bootstrap, job_sets, registry
        )


def _run(
    args: argparse.Namespace,
    seed: int,
    work: Path,
    inputs: Path,
    bootstrap: str,
    job_bootstrap: str,
    job_sets: list[str],
    registry: str | None,
) -> int:
    in_topic, out_topic = f"pv-events-{seed}", f"pv-counts-{seed}"
    asyncio.run(create_topics(bootstrap, {in_topic: args.partitions, out_topic: args.partitions}))
    started = time.monotonic()
    if registry is None:
        loaded = asyncio.run(load_jsonl(bootstrap, in_topic, inputs))
    else:
        loaded = asyncio.run(load_avro(bootstrap, in_topic, inputs, registry))
    took = time.monotonic() - started
    print(f"demo-kafka: loaded {loaded:,} events into {in_topic} in {took:.1f}s ({bootstrap})")
    sets = [
        f"job.name=demo-kafka-{seed}",
        f"checkpoint.dir={work / 'checkpoints'}",
        f"checkpoint.interval={args.interval}",
        f"job.parallelism={args.parallelism}",
        f"app.kafka_bootstrap={job_bootstrap}",
        f"app.input_topic={in_topic}",
        f"app.output_topic={out_topic}",
        "app.stop_at_end=1",
        *job_sets,
    ]
    if registry is not None:
        sets += ["app.format=avro", f"app.schema_registry={registry}"]
    if job_bootstrap != bootstrap:  # the proof reads and makes its topics on PLAINTEXT
        sets.append(f"app.proof_kafka_bootstrap={bootstrap}")
    cmd = [sys.executable, "-m", "aiostream_ckpt.daemon.cli", "run", "apps.pv_count"]
    cmd += [a for s in sets for a in ("--set", s)] + ["--progress", "1", *worker_flags()]

    result = run_demo_worker("demo-kafka", cmd, kills=args.kills, seed=seed, work=work)
    if result is None:
        return 1
    expected, malformed = recount_inputs([inputs])
    values = asyncio.run(read_topic_values(bootstrap, out_topic))
    if registry is not None:
        from aiostream_ckpt_dev.validate.confluent_avro import ConfluentAvroDecoder

        values = list(map(ConfluentAvroDecoder(registry), values))
    verdict = check_pv_updates(
        map(orjson.loads, values), expected, malformed=malformed, label="python read_committed"
    )
    print(verdict.report)
    passed = verdict.passed
    if registry is not None and not args.no_spark:
        print("demo-kafka: Spark check left out: the output is Avro (the proof below decodes it)")
    elif not args.no_spark:
        spark = _spark_check(work, inputs, bootstrap, out_topic)
        if spark is not None:
            print(f"spark validator (read_committed): {spark[1]}")
            passed = passed and spark[0]
    if args.proof:
        passed = _reference_proof(work, sets) and passed
    if args.windowed_kills:
        passed = (
            prove_windowed(
                "demo-kafka",
                work / "windowed",
                seed,
                kills=args.windowed_kills,
                kafka_bootstrap=bootstrap,
            ).passed
            and passed
        )
    if not passed or result.kills < args.kills:
        print(f"exactly-once FAILED ({result.kills} of {args.kills} kills happened)")
        return 1
    print(verified_line(verdict.events, verdict.keys, result.kills, args.windowed_kills))
    return 0
