"""Kafka -> Kafka at job.workers=2: the transactional sink's subtasks in two worker processes.

kill -9 of a worker (and of the main process) mid-run; the output topic, read
``read_committed``, must hold exactly the failure-free result. Transactional
ids are ``{job}-{uid}-{subtask}-{n}``: the subtask is the job's, not the
worker's, so the ids stay unique across workers and the same after a
restart, where they fence the killed worker's producers.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from aiokafka.client import AIOKafkaClient

from aiostream_ckpt.connectors.kafka.txn_admin import list_transactional_ids
from aiostream_ckpt_dev.chaos.kills import run_with_kills
from tests.helpers import REPO
from tests.integration.kafka.test_kafka_pv_count import KafkaJob, assert_exactly_once
from tests.integration.kafka.test_kafka_pv_count import kafka_job as kafka_job  # the fixture

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

#: Small batches: the first kill waits for a completed checkpoint, and its barrier comes
#: after all the source had emitted (channels hold 8 batches): at the default 2,048 a
#: batch, 45-54 % of map_async's 60 k events (30 % of pv_count's 120 k) were before it
#: at load ~2, so a faster machine could end before the kill; at 256, 15-25 %.
WORKERS = (
    "--set", "job.parallelism=2", "--set", "job.workers=2", "--set", "restart.delay=0s",
    "--set", "job.batch_size=256",
)  # fmt: skip
#: run_with_kills' seeded victims (2 workers): 8 takes worker 1, then the main process
WORKER_THEN_MAIN = 8


def run_killing_workers(job: KafkaJob, *extra: str, app: str = "apps.pv_count"):
    log = job.work / "worker.log"
    result = run_with_kills(
        job.cmd(*WORKERS, *extra, app=app, interval="100ms"),
        kills=2,
        seed=WORKER_THEN_MAIN,
        max_delay_after_checkpoint=0.2,
        timeout=240,
        log_path=log,
        cwd=REPO,
        kill_workers=True,
    )
    text = log.read_text()
    assert result.exit_code == 0, text[-4000:]
    assert result.worker_kills >= 1, text[-3000:]
    # the restarts are the kills': no attempt failed of a fenced or clashing transactional id
    assert "Fenced" not in text and "fenced" not in text, text[-3000:]
    started = re.findall(r"worker (\d) started \(pid \d+\): (.*)", text)
    # each worker runs a count subtask, the sink chained to it
    assert {(w, tasks) for w, tasks in started} == {
        ("0", "events-0, pv-count-0"),
        ("1", "events-1, pv-count-1"),
    }
    return result, text


async def transactional_ids(job: KafkaJob) -> list[str]:
    """Return the transactional ids the broker knows of the job's sink."""
    client = AIOKafkaClient(bootstrap_servers=job.bootstrap)
    await client.bootstrap()
    try:
        return await list_transactional_ids(client, prefix=f"pv-{job.output_topic}-pv-sink-")
    finally:
        await client.close()


async def test_kafka_to_kafka_exactly_once_under_kill9_of_a_worker(kafka_job, read_topic):
    job = await kafka_job(120_000, seed=21)
    await asyncio.to_thread(run_killing_workers, job)
    await assert_exactly_once(read_topic, job)
    # one pool per subtask (3 ids at checkpoint.max_concurrent=1), named by the job's
    # subtask index: the same ids in every attempt, whichever worker runs the subtask
    ids = await transactional_ids(job)
    assert {i.rsplit("-", 2)[1] for i in ids} == {"0", "1"} and len(ids) <= 2 * 3, ids


async def test_map_async_kafka_job_exactly_once_under_kill9_of_a_worker(kafka_job, read_topic):
    """The calls in flight are in the checkpoint of the worker that made them."""
    job = await kafka_job(60_000, seed=22)
    extra = ("--set", "app.latency=0")  # still a call awaited per record, none slept
    await asyncio.to_thread(run_killing_workers, job, *extra, app="tests.apps.kafka_async_count")
    await assert_exactly_once(read_topic, job)
