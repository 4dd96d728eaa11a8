"""Avro in the Confluent wire format: round trips, resolution, declared types, bad records."""

from __future__ import annotations

import dataclasses

import msgspec
import orjson
import pytest

from aiostream_ckpt.connectors.kafka.formats import (
    AvroFormat,
    Schema,
    SchemaRegistry,
    SubjectNameStrategy,
    WireFormatError,
)
from aiostream_ckpt.errors import ConfigError
from tests.schema_helpers import PV_V1, PV_V2


@dataclasses.dataclass
class PageView:
    app_id: str
    n: int
    region: str = "?"


class PageViewStruct(msgspec.Struct):
    app_id: str
    n: int


async def encode_with(url: str, schema: dict, records: list, **options) -> list[bytes]:
    fmt = AvroFormat(SchemaRegistry(url), schema, **options)
    async with fmt.registry.client() as client:
        encode = await fmt.encoder(client, "pv", is_key=False)
    return [encode(r) for r in records]


async def decode_with(fmt: AvroFormat, values: list) -> list:
    async with fmt.registry.client() as client:
        decoder = await fmt.decoder(client)
        await decoder.prepare(values)
        return [decoder.decode(v) for v in values]


async def test_round_trip_in_the_wire_format(stand_in):
    (raw,) = await encode_with(stand_in.url, PV_V1, [{"app_id": "a", "n": 7}])
    assert raw[:5] == b"\x00\x00\x00\x00\x01"  # magic byte, schema id 1
    assert raw[5:] == b"\x02a\x0e"  # Avro: string "a", zigzag int 7
    assert stand_in.state.subjects == {"pv-value": [1]}
    assert await decode_with(AvroFormat(SchemaRegistry(stand_in.url)), [raw, None]) == [
        {"app_id": "a", "n": 7},
        None,  # a tombstone stays one
    ]


async def test_reader_schema_resolves_older_writers(stand_in):
    old = await encode_with(stand_in.url, PV_V1, [{"app_id": "a", "n": 1}])
    new = await encode_with(stand_in.url, PV_V2, [{"app_id": "b", "n": 2**40, "region": "us"}])
    assert old[0][1:5] != new[0][1:5]  # two writer schemas
    fmt = AvroFormat(SchemaRegistry(stand_in.url), PV_V2)
    assert await decode_with(fmt, old + new) == [
        {"app_id": "a", "n": 1, "region": "eu"},  # v2's default filled in
        {"app_id": "b", "n": 2**40, "region": "us"},
    ]


async def test_declared_types_both_ways(stand_in):
    raws = await encode_with(stand_in.url, PV_V1, [PageViewStruct("s", 3), {"app_id": "d", "n": 4}])
    typed = AvroFormat(SchemaRegistry(stand_in.url), PV_V2, record_type=PageView)
    assert await decode_with(typed, raws) == [PageView("s", 3, "eu"), PageView("d", 4, "eu")]
    back = await encode_with(stand_in.url, PV_V2, [PageView("x", 5, "us")])
    structs = AvroFormat(SchemaRegistry(stand_in.url), record_type=PageViewStruct)
    assert await decode_with(structs, back) == [PageViewStruct("x", 5)]


async def test_records_that_do_not_decode_say_why(stand_in):
    (good,) = await encode_with(stand_in.url, PV_V1, [{"app_id": "a", "n": 1}])
    fmt = AvroFormat(SchemaRegistry(stand_in.url), PV_V1)
    unknown = b"\x00\x00\x00\x00\x63" + good[5:]
    truncated = good[:-1]
    trailing = good + b"\x00"
    async with fmt.registry.client() as client:
        decoder = await fmt.decoder(client)
        await decoder.prepare([good, unknown, b"{json", truncated, trailing])
        assert decoder.decode(good) == {"app_id": "a", "n": 1}
        with pytest.raises(WireFormatError, match="schema id 99 is not in the schema registry"):
            decoder.decode(unknown)
        with pytest.raises(WireFormatError, match="magic byte 123"):
            decoder.decode(b"{json")
        with pytest.raises(WireFormatError, match="empty record"):
            decoder.decode(b"")
        with pytest.raises(EOFError):
            decoder.decode(truncated)
        with pytest.raises(ValueError, match="1 bytes left"):
            decoder.decode(trailing)


async def test_reader_schema_that_cannot_read_the_writer_fails_the_record(stand_in):
    (raw,) = await encode_with(stand_in.url, PV_V1, [{"app_id": "a", "n": 1}])
    other = {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "int"}]}
    fmt = AvroFormat(SchemaRegistry(stand_in.url), other)
    async with fmt.registry.client() as client:
        decoder = await fmt.decoder(client)
        await decoder.prepare([raw])
        with pytest.raises(Exception, match=r"PageView|Other"):
            decoder.decode(raw)


async def test_sink_refuses_records_its_schema_does_not_describe(stand_in):
    fmt = AvroFormat(SchemaRegistry(stand_in.url), PV_V1)
    async with fmt.registry.client() as client:
        encode = await fmt.encoder(client, "pv", is_key=False)
    with pytest.raises((ValueError, TypeError)):
        encode({"app_id": "a"})  # n missing, no default
    with pytest.raises((ValueError, TypeError)):
        encode({"app_id": "a", "n": 1, "extra": 1})  # would be dropped silently
    with pytest.raises((ValueError, TypeError)):
        encode({"app_id": "a", "n": "seven"})


async def test_subject_strategies_and_lookup_only(stand_in):
    registry = SchemaRegistry(stand_in.url)
    fmt = AvroFormat(registry, PV_V1, subject_strategy="record")
    assert fmt.subject_for("pv", is_key=False) == "shop.events.PageView"
    fmt = AvroFormat(registry, PV_V1, subject_strategy=SubjectNameStrategy.TOPIC_RECORD)
    assert fmt.subject_for("pv", is_key=True) == "pv-shop.events.PageView"
    assert AvroFormat(registry, PV_V1).subject_for("pv", is_key=True) == "pv-key"
    lookup_only = AvroFormat(registry, PV_V1, auto_register=False)
    async with registry.client() as client:
        with pytest.raises(Exception, match="looking up the schema of subject 'pv-value'"):
            await lookup_only.encoder(client, "pv", is_key=False)
        await client.register("pv-value", Schema(orjson.dumps(PV_V1).decode()))
        encode = await lookup_only.encoder(client, "pv", is_key=False)
        latest = await AvroFormat(registry, use_latest=True).encoder(client, "pv", is_key=False)
    assert encode({"app_id": "a", "n": 1}) == latest({"app_id": "a", "n": 1})


def test_bad_declarations_are_config_errors(stand_in):
    registry = SchemaRegistry(stand_in.url)
    with pytest.raises(ConfigError, match="invalid Avro schema"):
        AvroFormat(registry, {"type": "record", "name": "X", "fields": [{"name": "a"}]})
    with pytest.raises(ConfigError, match="subject_strategy"):
        AvroFormat(registry, PV_V1, subject_strategy="wrong")
    with pytest.raises(ConfigError, match="needs a schema"):
        AvroFormat(registry).writer_schema()
    with pytest.raises(ConfigError, match="SchemaRegistry"):
        AvroFormat("http://r:8081", PV_V1)  # type: ignore[arg-type]
