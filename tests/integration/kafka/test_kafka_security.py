"""Kafka connectors over TLS and SASL: the test broker's SSL, SASL_SSL and SASL_PLAINTEXT listeners.

The session broker (``KafkaBroker(secure=True)``) serves them beside PLAINTEXT
with a certificate signed by a CA the test made and SCRAM-SHA-512 / PLAIN
users; the tests' own plumbing (topics, input, reading the output) stays on
PLAINTEXT, the job under test speaks only the secured listener. Wrong
credentials and an untrusted certificate fail the start at once with one line
naming the broker and what failed, before any output; passwords never show.
"""

from __future__ import annotations

import signal
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.checkpoint.config import CheckpointConfig
from aiostream_ckpt.connectors.kafka.security import KafkaSecurity
from aiostream_ckpt.connectors.kafka.sink import KafkaSink
from aiostream_ckpt.connectors.kafka.source import KafkaSource
from aiostream_ckpt.daemon.transactions import abort_one, list_rows, read_job_transactions
from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.testing import run_job_async
from aiostream_ckpt_dev.broker.security import USERS
from tests.helpers import DaemonProcess, cli, stable_equals_high_watermark

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

COMBOS = [
    ("SSL", None),
    ("SASL_SSL", "SCRAM-SHA-512"),
    ("SASL_SSL", "PLAIN"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512"),
    ("SASL_PLAINTEXT", "PLAIN"),
]


def security(broker, protocol: str, mechanism: str | None, password: str | None = None):
    tls = protocol.endswith("SSL")
    sasl = protocol.startswith("SASL_")
    return KafkaSecurity(
        protocol,
        sasl_mechanism=mechanism,
        sasl_username="alice" if sasl else None,
        sasl_password=(password or USERS["alice"]) if sasl else None,
        ssl_cafile=broker.certificates.ca_file if tls else None,
    ).validate()


def settings(broker, protocol: str, mechanism: str | None) -> list[str]:
    """``--set`` flags for a job on ``protocol`` (the password goes through the env)."""
    sets = [f"kafka.security_protocol={protocol}"]
    if protocol.startswith("SASL_"):
        sets += [f"kafka.sasl_mechanism={mechanism}", "kafka.sasl_username=alice"]
    if protocol.endswith("SSL"):
        sets.append(f"kafka.ssl_cafile={broker.certificates.ca_file}")
    return [a for s in sets for a in ("--set", s)]


async def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i, v in enumerate(values):
            await producer.send(topic, v, partition=i % 2)
        await producer.flush()
    finally:
        await producer.stop()


EVENTS = [orjson.dumps({"app_id": f"app-{i % 5}", "i": i}) for i in range(300)]


@pytest.mark.parametrize(("protocol", "mechanism"), COMBOS)
async def test_job_and_transactions_admin_over_each_listener(
    kafka_broker, new_topic, read_topic, tmp_path, protocol, mechanism
):
    plain = kafka_broker.bootstrap_servers
    secured = kafka_broker.listener(protocol)
    src, out = await new_topic(2), await new_topic(2)
    await produce(plain, src, EVENTS)
    sec = security(kafka_broker, protocol, mechanism)
    prefix = f"sec-{uuid.uuid4().hex[:8]}"
    ckpt = tmp_path / "ckpt"
    env = StreamEnvironment(
        "secure-job",
        config=JobConfig(batch_size=50, kafka=sec, checkpoint=CheckpointConfig(directory=ckpt)),
    )
    env.from_source(KafkaSource(src, secured, stop_at_end=True), uid="in").sink_to(
        KafkaSink(out, secured, key_fn=lambda e: e["app_id"], transactional_id_prefix=prefix),
        uid="out",
    )
    await run_job_async(env, {}, checkpoint_interval=0.2)
    await stable_equals_high_watermark(plain, out, 2)
    assert Counter(await read_topic(out)) == Counter(EVENTS)

    # the transactions admin (ListTransactions, DescribeTransactions, InitProducerId) too
    job = read_job_transactions(ckpt, [])
    assert set(job.prefixes) == {prefix}
    rows = await list_rows(secured, job, sec.client_kwargs())
    assert rows and all(r["transactional_id"].startswith(f"{prefix}-") for r in rows)
    assert all(r["recovery"] == "none" for r in rows)  # the job ended: nothing left open
    said = await abort_one(secured, job, rows[0]["transactional_id"], sec.client_kwargs())
    assert said.startswith(f"aborted {rows[0]['transactional_id']}")


async def test_transactions_command_reads_kafka_keys(kafka_broker, new_topic, tmp_path):
    plain, secured = kafka_broker.bootstrap_servers, kafka_broker.listener("SASL_SSL")
    src, out = await new_topic(2), await new_topic(2)
    await produce(plain, src, EVENTS[:20])
    ckpt = tmp_path / "ckpt"
    env = StreamEnvironment(
        "secure-cli",
        config=JobConfig(
            kafka=security(kafka_broker, "SASL_SSL", "SCRAM-SHA-512"),
            checkpoint=CheckpointConfig(directory=ckpt),
        ),
    )
    env.from_source(KafkaSource(src, secured, stop_at_end=True), uid="in").sink_to(
        KafkaSink(out, secured, transactional_id_prefix=f"cli-{out}"), uid="out"
    )
    await run_job_async(env, {}, checkpoint_interval=0.2)
    args = ["transactions", "list", "--checkpoint-dir", str(ckpt), "--bootstrap", secured]
    flags = settings(kafka_broker, "SASL_SSL", "SCRAM-SHA-512")
    password = {"AIOSTREAM_KAFKA__SASL_PASSWORD": USERS["alice"]}
    done = cli(*args, "--json", *flags, env=password)
    assert done.returncode == 0, done.stderr
    assert [r["transactional_id"] for r in orjson.loads(done.stdout)]
    wrong = cli(*args, *flags, env={"AIOSTREAM_KAFKA__SASL_PASSWORD": "not-her-password"})
    assert wrong.returncode != 0
    assert f"Kafka broker {secured} (SASL_SSL): SASL SCRAM-SHA-512 authentication of user " in (
        wrong.stderr
    )
    assert "not-her-password" not in wrong.stderr + wrong.stdout
    plain_only = cli(*args)  # no kafka.* keys: a plaintext client at a TLS port
    assert plain_only.returncode != 0


def pv_args(broker, bootstrap: str, src: str, out: str, work: Path, *extra: str) -> list[str]:
    return [
        "run",
        "apps.pv_count",
        "--set", f"checkpoint.dir={work / 'ckpt'}",
        "--set", "checkpoint.interval=200ms",
        "--set", f"app.kafka_bootstrap={bootstrap}",
        "--set", f"app.input_topic={src}",
        "--set", f"app.output_topic={out}",
        "--set", "app.kafka_connect_timeout=20",
        *extra,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("protocol", "what"),
    [
        ("SASL_SSL", "wrong password"),
        ("SASL_PLAINTEXT", "wrong password"),
        ("SSL", "untrusted certificate"),
        ("SASL_SSL", "unknown mechanism"),
    ],
)
async def test_bad_credentials_or_certificate_fail_at_start_naming_the_cause(
    kafka_broker, new_topic, read_topic, tmp_path, protocol, what
):
    plain, secured = kafka_broker.bootstrap_servers, kafka_broker.listener(protocol)
    src, out = await new_topic(2), await new_topic(2)
    await produce(plain, src, EVENTS[:10])
    flags = settings(kafka_broker, protocol, "SCRAM-SHA-512")
    env = {"AIOSTREAM_KAFKA__SASL_PASSWORD": "wrong-pw-7731"}
    if what == "untrusted certificate":
        flags += ["--set", f"kafka.ssl_cafile={kafka_broker.certificates.other_ca_file}"]
    if what == "unknown mechanism":
        flags += ["--set", "kafka.sasl_mechanism=SCRAM-SHA-256"]
        env = {"AIOSTREAM_KAFKA__SASL_PASSWORD": USERS["alice"]}
    done = cli(*pv_args(kafka_broker, secured, src, out, tmp_path, *flags), env=env, timeout=180)
    assert done.returncode != 0
    expected = {
        "wrong password": f"Kafka broker {secured} ({protocol}): SASL SCRAM-SHA-512 "
        "authentication of user 'alice' failed",
        "untrusted certificate": f"Kafka broker {secured} (SSL): TLS failed: the broker's "
        "certificate is not trusted",
        "unknown mechanism": f"Kafka broker {secured} (SASL_SSL): SASL mechanism SCRAM-SHA-256",
    }[what]
    assert expected in done.stderr, done.stderr[-3000:]
    assert "restart 1" not in done.stderr  # not retried: a restart cannot fix it
    assert "wrong-pw-7731" not in done.stderr + done.stdout
    assert await read_topic(out) == []  # before any output


def test_settings_that_do_not_fit_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"needs kafka\.sasl_mechanism"):
        KafkaSecurity("SASL_SSL", sasl_username="a", sasl_password="p").validate()
    with pytest.raises(ConfigError, match=r"needs one of kafka\.sasl_password"):
        KafkaSecurity("SASL_SSL", "PLAIN", "a").validate()
    with pytest.raises(ConfigError, match=r"kafka\.ssl_cafile='/nope': no such file"):
        KafkaSecurity("SSL", ssl_cafile=Path("/nope")).validate()
    with pytest.raises(ConfigError, match=r"need kafka\.security_protocol SASL_SSL"):
        KafkaSecurity("SSL", sasl_username="a").validate()
    assert "p4ss" not in repr(KafkaSecurity("SASL_SSL", "PLAIN", "a", "p4ss"))
    assert "p4ss" not in str(KafkaSecurity("SASL_SSL", "PLAIN", "a", "p4ss").describe())


async def test_password_never_in_logs_or_rest(kafka_broker, new_topic, read_topic, tmp_path):
    plain, secured = kafka_broker.bootstrap_servers, kafka_broker.listener("SASL_SSL")
    src, out = await new_topic(2), await new_topic(2)
    await produce(plain, src, EVENTS)
    flags = settings(kafka_broker, "SASL_SSL", "SCRAM-SHA-512")
    flags += ["--set", "log.level=DEBUG"]
    password = USERS["alice"]
    args = pv_args(kafka_broker, secured, src, out, tmp_path, *flags)
    with DaemonProcess(*args, env={"AIOSTREAM_KAFKA__SASL_PASSWORD": password}) as daemon:
        daemon.wait_for("checkpoint 3 completed", timeout=120)
        status, job = daemon.request("GET", "/job")
        assert status == 200
        assert job["config"]["kafka"] == {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "alice",
            "sasl_password": "(set)",
            "ssl_cafile": str(kafka_broker.certificates.ca_file),
            "ssl_client_certificate": False,
            "ssl_check_hostname": True,
        }
        views = [orjson.dumps(daemon.request("GET", p)[1]) for p in ("/job", "/operators")]
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.wait(timeout=120)
    assert password.encode() not in b"".join(views)
    assert " DEBUG " in daemon.stderr  # our DEBUG logs ran (aiokafka's stay at WARNING+)
    assert password not in daemon.stderr
    await stable_equals_high_watermark(plain, out, 2)
    assert len(await read_topic(out)) == len(EVENTS)
