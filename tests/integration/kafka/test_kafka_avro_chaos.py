"""Exactly-once with Avro values over SASL_SSL: kill -9 rounds proven against a failure-free run.

pv_count reads Avro ``PageView`` values and writes Avro counts (Confluent
wire format, the stand-in registry), speaking only the broker's SASL_SSL
listener (SCRAM-SHA-512, the test CA), configured by the ``kafka.*`` keys
with the password in the environment. ``chaos`` kills it at the checkpoint
protocol's windows and at random, and proves every round's output topic,
read ``read_committed`` and decoded by the proof's own Avro reader, equal to
a failure-free reference run and to the independent recount: nothing lost,
nothing twice.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from aiostream_ckpt_dev.broker.security import USERS
from aiostream_ckpt_dev.chaos.cli import run_chaos
from aiostream_ckpt_dev.demo.kafka import create_topics, load_avro
from aiostream_ckpt_dev.schema_registry import SchemaRegistryStandIn
from aiostream_ckpt_dev.validate.proof import AppRun, load_contract
from tests.helpers import make_pv_input

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

PV = load_contract("apps.pv_count")
EVENTS = 6_000


def test_chaos_avro_over_sasl_ssl_loses_and_duplicates_nothing(
    kafka_broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain, secured = kafka_broker.bootstrap_servers, kafka_broker.listener("SASL_SSL")
    tag = uuid.uuid4().hex[:8]
    in_topic, out_topic = f"avro-in-{tag}", f"avro-out-{tag}"
    with SchemaRegistryStandIn() as registry:
        asyncio.run(create_topics(plain, {in_topic: 3, out_topic: 2}))
        inp = make_pv_input(tmp_path / "in.jsonl", EVENTS, seed=5, keys=40)
        assert asyncio.run(load_avro(plain, in_topic, inp, registry.url)) == EVENTS
        monkeypatch.setenv("AIOSTREAM_KAFKA__SASL_PASSWORD", USERS["alice"])
        sets = [
            f"job.name=avro-chaos-{tag}",
            f"checkpoint.dir={tmp_path / 'ckpt'}",
            # Kafka input cannot be paced: small batches span many checkpoints
            "checkpoint.interval=5ms",
            "job.batch_size=4",
            f"app.kafka_bootstrap={secured}",
            f"app.proof_kafka_bootstrap={plain}",  # the proof reads on PLAINTEXT
            f"app.input_topic={in_topic}",
            f"app.output_topic={out_topic}",
            "app.stop_at_end=1",
            "app.format=avro",
            f"app.schema_registry={registry.url}",
            "kafka.security_protocol=SASL_SSL",
            "kafka.sasl_mechanism=SCRAM-SHA-512",
            "kafka.sasl_username=alice",
            f"kafka.ssl_cafile={kafka_broker.certificates.ca_file}",
        ]
        verdict = run_chaos(
            AppRun("apps.pv_count", sets),
            PV,
            kills=4,
            seed=21,
            workdir=tmp_path / "chaos",
            kills_per_round=4,
            echo=False,
            oracle=True,
        )
        # the registry holds the input's and the output's schema: the run wrote Avro
        assert {f"{in_topic}-value"} < set(registry.state.subjects)
    assert verdict.passed, verdict.problems
    assert any("independent recount (oracle)" in a for a in verdict.assumptions)
    assert verdict.kills >= 4
    assert verdict.counts["missing"] == verdict.counts["duplicated"] == 0
    assert verdict.events == EVENTS * verdict.rounds
    assert verdict.line().endswith("lost=0 duplicated=0 verdict=PASS")
