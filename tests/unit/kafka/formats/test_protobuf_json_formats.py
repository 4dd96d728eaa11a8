"""Protobuf (message indexes, imports as references) and JSON Schema, Confluent-framed."""

from __future__ import annotations

import base64
import dataclasses

import pytest

from aiostream_ckpt.connectors.kafka.formats import (
    JsonSchemaFormat,
    ProtobufFormat,
    SchemaRegistry,
    WireFormatError,
)
from aiostream_ckpt.connectors.kafka.formats.wire import (
    decode_message_indexes,
    encode_message_indexes,
)
from aiostream_ckpt.errors import ConfigError
from tests.schema_helpers import PV_JSON_SCHEMA, proto_classes

ORDER = {
    "id": "o-1",
    "qty": 2**40,
    "status": "PAID",
    "lines": [{"sku": "x", "qty": 2}],
    "attrs": {"k": 5},
    "total": {"cents": 1999, "currency": "EUR"},
}


@dataclasses.dataclass
class Line:
    sku: str
    qty: int


@dataclasses.dataclass
class Order:
    id: str
    qty: int
    status: str
    lines: list[Line]
    attrs: dict[str, int]
    total: dict | None


@pytest.mark.parametrize("indexes", [[0], [1], [1, 0], [3, 200, 1]])
def test_message_indexes_round_trip(indexes):
    raw = encode_message_indexes(indexes)
    assert decode_message_indexes(b"xx" + raw + b"payload", 2) == (indexes, 2 + len(raw))
    if indexes == [0]:
        assert raw == b"\x00"


async def test_protobuf_round_trip_with_references(stand_in):
    classes = proto_classes()
    fmt = ProtobufFormat(SchemaRegistry(stand_in.url), classes["Order"])
    async with fmt.registry.client() as client:
        encode = await fmt.encoder(client, "orders", is_key=False)
        raw = encode(ORDER)
        assert raw == encode(classes["Order"](**ORDER))  # a message or its dict
        decoder = await fmt.decoder(client)
        await decoder.prepare([raw])
        assert decoder.decode(raw) == ORDER
    assert raw[5:7] == b"\x02\x02"  # message indexes [1] (count 1, index 1; zigzag)
    # the import is registered first under its file name, and referenced
    assert set(stand_in.state.subjects) == {"shop/money.proto", "orders-value"}
    order_schema = stand_in.state.schemas[stand_in.state.subjects["orders-value"][0]]
    assert order_schema.references == [
        {"name": "shop/money.proto", "subject": "shop/money.proto", "version": 1}
    ]
    assert base64.b64decode(order_schema.schema) == classes["Order"].DESCRIPTOR.file.serialized_pb


async def test_protobuf_outputs_messages_or_declared_types(stand_in):
    classes = proto_classes()
    registry = SchemaRegistry(stand_in.url)
    async with registry.client() as client:
        raw = (await ProtobufFormat(registry, classes["Order"]).encoder(client, "o", is_key=False))(
            ORDER
        )
        as_msg = await ProtobufFormat(registry, classes["Order"], output="message").decoder(client)
        typed = await ProtobufFormat(registry, classes["Order"], record_type=Order).decoder(client)
        await as_msg.prepare([raw])
        await typed.prepare([raw])
        assert as_msg.decode(raw) == classes["Order"](**ORDER)
        assert typed.decode(raw) == Order(
            "o-1", 2**40, "PAID", [Line("x", 2)], {"k": 5}, {"cents": 1999, "currency": "EUR"}
        )


async def test_protobuf_refuses_other_schema_types_and_bad_payloads(stand_in):
    registry = SchemaRegistry(stand_in.url)
    fmt = ProtobufFormat(registry, proto_classes()["Order"])
    async with registry.client() as client:
        json_raw = (
            await JsonSchemaFormat(registry, PV_JSON_SCHEMA).encoder(client, "pv", is_key=False)
        )({"app_id": "a", "n": 1})
        decoder = await fmt.decoder(client)
        await decoder.prepare([json_raw])
        with pytest.raises(WireFormatError, match="is JSON; this format reads PROTOBUF"):
            decoder.decode(json_raw)
        raw = (await fmt.encoder(client, "orders", is_key=False))(ORDER)
        await decoder.prepare([raw])
        with pytest.raises(Exception, match=r"(?i)pars|truncated|error"):
            decoder.decode(raw[:-3])
    with pytest.raises(ConfigError, match="generated message class"):
        ProtobufFormat(registry, dict)


async def test_json_schema_round_trip_and_validation(stand_in):
    registry = SchemaRegistry(stand_in.url)
    fmt = JsonSchemaFormat(registry, PV_JSON_SCHEMA)
    async with registry.client() as client:
        encode = await fmt.encoder(client, "pv", is_key=False)
        raw = encode({"app_id": "a", "n": 1})
        assert raw == b"\x00\x00\x00\x00\x01" + b'{"app_id":"a","n":1}'
        with pytest.raises(ValueError, match="at n: 'x' is not of type 'integer'"):
            encode({"app_id": "a", "n": "x"})
        decoder = await JsonSchemaFormat(registry).decoder(client)
        bad = b"\x00\x00\x00\x00\x01" + b'{"app_id":"a"}'
        await decoder.prepare([raw, bad])
        assert decoder.decode(raw) == {"app_id": "a", "n": 1}
        with pytest.raises(ValueError, match="'n' is a required property"):
            decoder.decode(bad)
    assert fmt.subject_for("t", is_key=False) == "t-value"
    assert (
        JsonSchemaFormat(registry, PV_JSON_SCHEMA, subject_strategy="record").subject_for(
            "t", is_key=False
        )
        == "PageView"
    )
    with pytest.raises(ConfigError, match="invalid JSON schema"):
        JsonSchemaFormat(registry, {"type": 12})
