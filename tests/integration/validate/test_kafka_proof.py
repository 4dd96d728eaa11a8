"""The reference-run proof on Kafka output: read_committed, by readers that share no sink code.

pv_count runs Kafka to Kafka on the real broker. The proof reads both its
output topic and the reference run's topic as a ``read_committed`` consumer:
records of aborted transactions must not count, a committed duplicate must.
Kafka's own console consumer (``kafka-console-consumer``, from the broker's
release, not ours) reads the same topic and must see the same records; and
``chaos`` kills the job at the checkpoint windows and proves every round,
against the reference and against the app's oracle recounting the input topic.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from aiostream_ckpt_dev.broker.process import KafkaBroker
from aiostream_ckpt_dev.broker.tools import CONSOLE_CONSUMER, run_kafka_tool
from aiostream_ckpt_dev.chaos.cli import run_chaos
from aiostream_ckpt_dev.demo.kafka import create_topics, load_jsonl, worker_flags
from aiostream_ckpt_dev.validate.parse import canonical
from aiostream_ckpt_dev.validate.proof import AppRun, compare_dirs, compare_oracle, load_contract
from aiostream_ckpt_dev.validate.proof_cli import prove
from aiostream_ckpt_dev.validate.proof_kafka import KafkaTopic, read_committed, write_values
from tests.helpers import cli, make_pv_input

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

PV = load_contract("apps.pv_count")
EVENTS = 20_000


@dataclass
class KafkaRun:
    bootstrap: str
    output: str
    sets: list[str]


def _sets(bootstrap: str, in_topic: str, out_topic: str, work: Path) -> list[str]:
    return [
        f"job.name=pv-{out_topic}",
        f"checkpoint.dir={work / 'ckpt'}",
        "checkpoint.interval=100ms",
        f"app.kafka_bootstrap={bootstrap}",
        f"app.input_topic={in_topic}",
        f"app.output_topic={out_topic}",
        "app.stop_at_end=1",
    ]


@pytest.fixture(scope="module")
def pv_kafka(kafka_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> KafkaRun:
    """pv_count, Kafka to Kafka (3 input, 2 output partitions), one failure-free run."""
    d = tmp_path_factory.mktemp("pvk")
    bootstrap = kafka_broker.bootstrap_servers
    tag = uuid.uuid4().hex[:8]
    in_topic, out_topic = f"in-{tag}", f"out-{tag}"
    asyncio.run(create_topics(bootstrap, {in_topic: 3, out_topic: 2}))
    inp = make_pv_input(d / "in.jsonl", EVENTS, seed=9, keys=60)
    assert asyncio.run(load_jsonl(bootstrap, in_topic, inp)) == EVENTS
    sets = _sets(bootstrap, in_topic, out_topic, d)
    args = ["run", "apps.pv_count", *worker_flags()]
    for s in sets:
        args += ["--set", s]
    done = cli(*args, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return KafkaRun(bootstrap, out_topic, sets)


async def _produce(bootstrap: str, topic: str, records: list[dict[str, object]], *, abort: bool):
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"plant-{uuid.uuid4().hex[:8]}",
        linger_ms=5,
        max_batch_size=1 << 20,
    )
    await producer.start()
    try:
        await producer.begin_transaction()
        for r in records:  # in order: one key's records go to one partition
            await producer.send(topic, orjson.dumps(r), key=str(r["app_id"]).encode())
        if abort:
            await producer.abort_transaction()
        else:
            await producer.commit_transaction()
    finally:
        await producer.stop()


def _copy_topic(run: KafkaRun, tmp: str) -> KafkaTopic:
    """A new topic with the run's committed records, in the same partitions and order."""
    records = [
        orjson.loads(c) for c, _, _, _ in read_committed(KafkaTopic(run.bootstrap, run.output))
    ]
    copy = f"{run.output}-{tmp}"
    asyncio.run(create_topics(run.bootstrap, {copy: 2}))
    asyncio.run(_produce(run.bootstrap, copy, records, abort=False))
    return KafkaTopic(run.bootstrap, copy)


def test_proof_of_a_topic_passes_and_ignores_aborted_records(
    pv_kafka: KafkaRun, tmp_path: Path
) -> None:
    out = KafkaTopic(pv_kafka.bootstrap, pv_kafka.output)
    first = read_committed(out, "app_id")[0]
    replay = orjson.loads(first[0])
    # a zombie's transaction, aborted: a replayed update that read_committed must not see
    asyncio.run(_produce(out.bootstrap, out.topic, [replay, replay], abort=True))
    report = prove(AppRun("apps.pv_count", pv_kafka.sets), PV, tmp_path / "scratch")
    assert report.passed, report.verdict_line()
    main = report.results[0]
    assert main.check == "output_topic"
    assert main.counts["records_out"] == main.counts["reference_records"] == EVENTS
    assert "(read_committed)" in main.notes[0] and "fast (no Spark)" in main.notes[-1]
    checks = [r.check for r in report.results]
    assert checks[0] == "output_topic" and "determinism: output_topic" in checks


def test_proof_of_a_topic_finds_a_committed_duplicate_and_a_loss(
    pv_kafka: KafkaRun, tmp_path: Path
) -> None:
    reference = _copy_topic(pv_kafka, "ref")
    out = KafkaTopic(pv_kafka.bootstrap, pv_kafka.output)
    records = read_committed(out, "app_id")
    dup = orjson.loads(records[5][0])
    bad = _copy_topic(pv_kafka, "bad")
    asyncio.run(_produce(bad.bootstrap, bad.topic, [dup], abort=False))  # committed again
    c = compare_dirs(bad, reference, PV)
    assert (c.counts["duplicated"], c.counts["missing"], c.counts["unexpected"]) == (1, 0, 0)
    assert c.examples["duplicated"][0]["at"].startswith(f"{bad.topic}/")
    assert c.examples["duplicated"][0]["earlier_at"].startswith(f"{bad.topic}/")
    # the reference has one more record than the output: a loss
    asyncio.run(
        _produce(reference.bootstrap, reference.topic, [{"app_id": "zz", "pv": 1}], abort=False)
    )
    c = compare_dirs(out, reference, PV)
    assert (c.counts["missing"], c.counts["duplicated"]) == (1, 0)
    assert c.examples["missing"][0]["record"] == '{"app_id":"zz","pv":1}'


def test_oracle_recounts_the_input_topic_and_finds_a_duplicate_on_a_topic(
    pv_kafka: KafkaRun, tmp_path: Path
) -> None:
    """The Kafka input written out as lines is what pv_count's oracle recounts from."""
    in_topic = next(s for s in pv_kafka.sets if s.startswith("app.input_topic=")).partition("=")[2]
    lines = tmp_path / "input.jsonl"
    assert write_values(KafkaTopic(pv_kafka.bootstrap, in_topic), lines) == EVENTS
    assert PV.oracle is not None and PV.kafka_oracle_input == "input"
    expected = list(PV.oracle({"input": str(lines)}))
    assert len(expected) == EVENTS
    out = KafkaTopic(pv_kafka.bootstrap, pv_kafka.output)
    assert compare_oracle(out, expected, PV).passed
    bad = _copy_topic(pv_kafka, "oracle")
    dup = orjson.loads(read_committed(out, "app_id")[3][0])
    asyncio.run(_produce(bad.bootstrap, bad.topic, [dup], abort=False))  # committed again
    c = compare_oracle(bad, expected, PV)
    assert (c.counts["duplicated"], c.counts["missing"], c.counts["unexpected"]) == (1, 0, 0)


# -- a reader nobody here wrote --------------------------------------------------------


def _console_consumer(bootstrap: str, topic: str, count: int) -> Iterator[tuple[int, int, str]]:
    """``(partition, offset, value)`` of ``count`` records, read by kafka-console-consumer.

    It stops at ``count`` records or once a poll has waited ``--timeout-ms`` for
    the next one. Every record is committed before it starts, so a short idle
    wait only ends the run sooner (60 s took a minute of every suite run); a
    reader that lost records would show fewer, never a false pass.
    """
    done = run_kafka_tool(
        CONSOLE_CONSUMER,
        [
            "--bootstrap-server", bootstrap, "--topic", topic, "--from-beginning",
            "--isolation-level", "read_committed", "--max-messages", str(count),
            "--timeout-ms", "15000",
            "--property", "print.partition=true", "--property", "print.offset=true",
            "--property", "print.value=true",
        ],
    )  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith("Partition:"):
            part, off, value = line.split("\t", 2)
            yield int(part.split(":")[1]), int(off.split(":")[1]), value
    assert "Processed a total of" in done.stderr, done.stderr[-2000:]


def test_kafkas_console_consumer_reads_what_the_proof_reads(pv_kafka: KafkaRun) -> None:
    out = KafkaTopic(pv_kafka.bootstrap, pv_kafka.output)
    ours = read_committed(out)
    # ask for one more than there are: it must time out having found no more
    theirs = list(_console_consumer(out.bootstrap, out.topic, len(ours) + 1))
    assert len(theirs) == len(ours) >= EVENTS
    theirs_by_place = {
        f"{out.topic}/{p}@{o}": canonical(v.encode(), None, ())[0] for p, o, v in theirs
    }
    assert {at: c for c, _, _, at in ours} == theirs_by_place  # same records at the same offsets
    assert Counter(theirs_by_place.values()) == Counter(c for c, _, _, _ in ours)


# -- chaos: kill -9 a Kafka -> Kafka job, prove every round ---------------------------


def test_chaos_on_kafka_to_kafka_loses_and_duplicates_nothing(
    pv_kafka: KafkaRun, tmp_path: Path
) -> None:
    # Kafka input cannot be paced: small batches make a run span many checkpoints on
    # any machine, so the planned kills (up to the 3rd completed checkpoint) are reached
    sets = [*pv_kafka.sets[:2], *pv_kafka.sets[3:], "checkpoint.interval=5ms", "job.batch_size=4"]
    run = AppRun("apps.pv_count", sets)
    verdict = run_chaos(
        run,
        PV,
        kills=4,
        seed=12,
        workdir=tmp_path / "chaos",
        kills_per_round=4,
        echo=False,
        oracle=True,
    )
    assert verdict.passed, verdict.problems
    # the oracle ran on the input topic (before, it was skipped without a word)
    assert any("independent recount (oracle)" in a for a in verdict.assumptions)
    assert verdict.kills >= 4
    assert verdict.counts["missing"] == verdict.counts["duplicated"] == 0
    assert verdict.events == EVENTS * verdict.rounds
    assert verdict.line().endswith("lost=0 duplicated=0 verdict=PASS")


@pytest.mark.spark
def test_spark_path_reads_the_topic_with_sparks_kafka_source(
    spark: Any, pv_kafka: KafkaRun
) -> None:
    from aiostream_ckpt_dev.validate.proof import ComparedOutput
    from aiostream_ckpt_dev.validate.proof_spark import spark_results
    from aiostream_ckpt_dev.validate.session import get_spark

    out = KafkaTopic(pv_kafka.bootstrap, pv_kafka.output)
    reference = _copy_topic(pv_kafka, "sref")
    bad = _copy_topic(pv_kafka, "sbad")
    dup = orjson.loads(read_committed(out)[7][0])
    asyncio.run(_produce(bad.bootstrap, bad.topic, [dup], abort=False))
    asyncio.run(_produce(bad.bootstrap, bad.topic, [dup, dup], abort=True))  # invisible
    plan = [ComparedOutput("bad", bad, reference), ComparedOutput("same", out, reference)]
    results = spark_results(get_spark(kafka=True), plan, PV)  # the session fixture's
    fast = compare_dirs(bad, reference, PV)
    assert results[0].counts == fast.counts
    assert (fast.counts["duplicated"], fast.counts["missing"]) == (1, 0)
    assert results[1].passed and results[1].counts["records_out"] == EVENTS


@pytest.mark.spark
def test_kafka_source_after_a_session_without_it(
    pv_kafka: KafkaRun, subprocess_env: dict[str, str]
) -> None:
    """A session started without the Kafka source, then one with it, in one process.

    Before, the second session ran on the first one's JVM, whose classpath
    lacked the jars: "Failed to find data source: kafka". A child process,
    so that the test session's own Spark is left alone.
    """
    script = (
        "import sys\n"
        "from aiostream_ckpt_dev.validate.readers import read_kafka_output\n"
        "from aiostream_ckpt_dev.validate.session import get_spark, stop_spark\n"
        "assert get_spark().range(3).count() == 3\n"
        "spark = get_spark(kafka=True)\n"
        "print('COUNT', read_kafka_output(spark, sys.argv[1], sys.argv[2]).df.count())\n"
        "stop_spark()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, pv_kafka.bootstrap, pv_kafka.output],
        capture_output=True,
        text=True,
        timeout=600,
        env=subprocess_env,
        check=False,
    )
    assert f"COUNT {EVENTS}" in done.stdout, done.stderr[-3000:]
