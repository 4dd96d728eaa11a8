"""Our wire format against Confluent's own serializers, both ways, through the same registry.

Confluent's ``confluent-kafka`` Python client (the real one, from PyPI) is
pointed at the stand-in registry our formats use: what ours writes, theirs
reads, and the reverse, for Avro (with schema evolution) and Protobuf (a
nested message type, so non-trivial message indexes, and an import registered
as a reference). This is what makes the stand-in's answers and our bytes
Confluent's, not our own reading of the spec.
"""

from __future__ import annotations

import orjson
import pytest

from aiostream_ckpt.connectors.kafka.formats import AvroFormat, ProtobufFormat, SchemaRegistry
from tests.schema_helpers import PV_V1, PV_V2, proto_classes

pytest.importorskip("confluent_kafka.schema_registry")  # the dev extra installs it

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.protobuf import (
    ProtobufDeserializer,
    ProtobufSerializer,
)
from confluent_kafka.serialization import MessageField, SerializationContext

VALUE = SerializationContext("pv", MessageField.VALUE)
ORDER = {
    "id": "o-1",
    "qty": 7,
    "status": "PAID",
    "lines": [{"sku": "x", "qty": 2}],
    "attrs": {"k": 5},
    "total": {"cents": 1999, "currency": "EUR"},
}


async def ours_decode(fmt, values):
    async with fmt.registry.client() as client:
        decoder = await fmt.decoder(client)
        await decoder.prepare(values)
        return [decoder.decode(v) for v in values]


async def ours_encode(fmt, topic, records):
    async with fmt.registry.client() as client:
        encode = await fmt.encoder(client, topic, is_key=False)
    return [encode(r) for r in records]


async def test_avro_ours_writes_theirs_reads(stand_in):
    raws = await ours_encode(
        AvroFormat(SchemaRegistry(stand_in.url), PV_V1), "pv", [{"app_id": "a", "n": 1}]
    )
    theirs = AvroDeserializer(SchemaRegistryClient({"url": stand_in.url}))
    assert theirs(raws[0], VALUE) == {"app_id": "a", "n": 1}
    with_reader = AvroDeserializer(
        SchemaRegistryClient({"url": stand_in.url}), orjson.dumps(PV_V2).decode()
    )
    assert with_reader(raws[0], VALUE) == {"app_id": "a", "n": 1, "region": "eu"}


async def test_avro_theirs_writes_ours_reads(stand_in):
    client = SchemaRegistryClient({"url": stand_in.url})
    v1 = AvroSerializer(client, orjson.dumps(PV_V1).decode())({"app_id": "a", "n": 1}, VALUE)
    v2 = AvroSerializer(client, orjson.dumps(PV_V2).decode())(
        {"app_id": "b", "n": 2, "region": "us"}, VALUE
    )
    assert stand_in.state.subjects["pv-value"] == [1, 2]  # they registered two versions
    fmt = AvroFormat(SchemaRegistry(stand_in.url), PV_V2)
    assert await ours_decode(fmt, [v1, v2]) == [
        {"app_id": "a", "n": 1, "region": "eu"},
        {"app_id": "b", "n": 2, "region": "us"},
    ]
    # and the same schema registered by both is one id: our writes equal theirs byte for byte
    ours = await ours_encode(
        AvroFormat(SchemaRegistry(stand_in.url), PV_V2),
        "pv",
        [{"app_id": "b", "n": 2, "region": "us"}],
    )
    assert ours == [v2]


async def test_protobuf_ours_writes_theirs_reads(stand_in):
    classes = proto_classes()
    raws = await ours_encode(
        ProtobufFormat(SchemaRegistry(stand_in.url), classes["Order"]), "orders", [ORDER]
    )
    theirs = ProtobufDeserializer(classes["Order"], {"use.deprecated.format": False})
    assert theirs(raws[0], SerializationContext("orders", MessageField.VALUE)) == classes["Order"](
        **ORDER
    )
    line = await ours_encode(
        ProtobufFormat(SchemaRegistry(stand_in.url), classes["Order.Line"]),
        "lines",
        [{"sku": "y", "qty": 3}],
    )
    their_line = ProtobufDeserializer(classes["Order.Line"], {"use.deprecated.format": False})
    assert their_line(line[0], SerializationContext("lines", MessageField.VALUE)) == classes[
        "Order.Line"
    ](sku="y", qty=3)


async def test_protobuf_theirs_writes_ours_reads(stand_in):
    classes = proto_classes()
    client = SchemaRegistryClient({"url": stand_in.url})
    ctx = SerializationContext("orders", MessageField.VALUE)
    theirs = ProtobufSerializer(classes["Order"], client, {"use.deprecated.format": False})
    raw = theirs(classes["Order"](**ORDER), ctx)
    assert "shop/money.proto" in stand_in.state.subjects  # their import, as a reference
    fmt = ProtobufFormat(SchemaRegistry(stand_in.url), classes["Order"])
    assert await ours_decode(fmt, [raw]) == [ORDER]
    ours = await ours_encode(fmt, "orders", [ORDER])
    assert ours == [raw]  # same schema id, same message indexes, same payload
