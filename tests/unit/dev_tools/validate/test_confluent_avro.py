"""The proof's own Avro reader: Confluent-framed values to JSON, by the app's params."""

from __future__ import annotations

import orjson
import pytest

from aiostream_ckpt.connectors.kafka.formats import AvroFormat, SchemaRegistry
from aiostream_ckpt_dev.schema_registry import SchemaRegistryStandIn
from aiostream_ckpt_dev.validate.confluent_avro import ConfluentAvroDecoder, value_decoder
from aiostream_ckpt_dev.validate.errors import ValidationConfigError
from aiostream_ckpt_dev.validate.proof import kafka_bootstrap, load_contract
from aiostream_ckpt_dev.validate.proof_kafka import KafkaTopic, app_topic, registry_of
from apps.pv_count import PV_SCHEMA

PV = load_contract("apps.pv_count")


async def test_decodes_what_the_sink_format_writes_and_keeps_the_rest():
    with SchemaRegistryStandIn() as registry:
        fmt = AvroFormat(SchemaRegistry(registry.url), PV_SCHEMA)
        async with fmt.registry.client() as client:
            encode = await fmt.encoder(client, "pv", is_key=False)
        decode = ConfluentAvroDecoder(registry.url)
        assert orjson.loads(decode(encode({"app_id": "a", "pv": 3}))) == {"app_id": "a", "pv": 3}
        assert decode(b"{not framed") == b"{not framed"  # compared raw, as the JSON path


def test_params_choose_the_decoder_and_the_proofs_listener():
    params = {
        "kafka_bootstrap": "h:9094",
        "output_topic": "out",
        "format": "avro",
        "schema_registry": "http://r:8081",
    }
    topic = app_topic(PV, params, "h:9094", "output_topic")
    assert registry_of(topic) == "http://r:8081"
    assert topic == KafkaTopic("h:9094", "out")  # the decoder is not part of its identity
    assert registry_of(app_topic(PV, {**params, "format": "json"}, "h", "output_topic")) is None
    with pytest.raises(ValidationConfigError, match=r"needs app\.schema_registry"):
        value_decoder("format", "schema_registry", {"format": "avro"})
    assert kafka_bootstrap(PV, params) == "h:9094"
    assert kafka_bootstrap(PV, {**params, "proof_kafka_bootstrap": "h:9092"}) == "h:9092"
