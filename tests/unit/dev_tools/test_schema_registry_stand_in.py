"""The stand-in registry's Avro compatibility rules, checked against fastavro's own resolution."""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request

import fastavro
import pytest

from aiostream_ckpt_dev.schema_registry import SchemaRegistryStandIn
from aiostream_ckpt_dev.schema_registry.avro_compat import incompatibilities


def rec(*fields, name="R"):
    return {"type": "record", "name": name, "fields": list(fields)}


def f(name, type_, **kw):
    return {"name": name, "type": type_, **kw}


# (reader, writer, a datum of the writer, compatible?)
CASES = [
    (rec(f("a", "long")), rec(f("a", "int")), {"a": 5}, True),  # promotion
    (rec(f("a", "int")), rec(f("a", "long")), {"a": 5}, False),
    (rec(f("a", "double")), rec(f("a", "float")), {"a": 1.5}, True),
    (rec(f("a", "bytes")), rec(f("a", "string")), {"a": "x"}, True),
    (rec(f("a", "int"), f("b", "string", default="d")), rec(f("a", "int")), {"a": 1}, True),
    (rec(f("a", "int"), f("b", "string")), rec(f("a", "int")), {"a": 1}, False),
    (rec(f("a", "int")), rec(f("a", "int"), f("b", "string")), {"a": 1, "b": "x"}, True),
    (rec(f("b", "int", aliases=["a"])), rec(f("a", "int")), {"a": 1}, True),
    (rec(f("a", ["null", "int"])), rec(f("a", "int")), {"a": 1}, True),
    (rec(f("a", "int")), rec(f("a", ["null", "int"])), {"a": 1}, False),
    (rec(f("a", ["null", "long"])), rec(f("a", ["null", "int"])), {"a": None}, True),
    (
        rec(f("e", {"type": "enum", "name": "E", "symbols": ["X", "Y", "Z"]})),
        rec(f("e", {"type": "enum", "name": "E", "symbols": ["X", "Y"]})),
        {"e": "Y"},
        True,
    ),
    (
        rec(f("e", {"type": "enum", "name": "E", "symbols": ["X"]})),
        rec(f("e", {"type": "enum", "name": "E", "symbols": ["X", "Y"]})),
        {"e": "X"},
        False,
    ),
    (
        rec(f("e", {"type": "enum", "name": "E", "symbols": ["X"], "default": "X"})),
        rec(f("e", {"type": "enum", "name": "E", "symbols": ["X", "Y"]})),
        {"e": "Y"},
        True,
    ),
    (
        rec(f("a", {"type": "array", "items": "long"})),
        rec(f("a", {"type": "array", "items": "int"})),
        {"a": [1]},
        True,
    ),
    (
        rec(f("a", {"type": "map", "values": "int"})),
        rec(f("a", {"type": "map", "values": "long"})),
        {"a": {"k": 1}},
        False,
    ),
    (
        rec(f("a", {"type": "fixed", "name": "F", "size": 4})),
        rec(f("a", {"type": "fixed", "name": "F", "size": 8})),
        {"a": b"12345678"},
        False,
    ),
    (rec(f("a", "int"), name="Other"), rec(f("a", "int")), {"a": 1}, False),
    (
        rec(f("t", {"type": "long", "logicalType": "timestamp-millis"})),
        rec(f("t", "long")),
        {"t": 5},
        True,
    ),
    (
        rec(f("v", "int"), f("next", ["null", "LL"], default=None), name="LL"),
        rec(f("v", "int"), f("next", ["null", "LL"]), name="LL"),
        {"v": 1, "next": {"v": 2, "next": None}},
        True,
    ),
]


@pytest.mark.parametrize(("reader", "writer", "datum", "compatible"), CASES)
def test_rules_agree_with_fastavro_resolution(reader, writer, datum, compatible):
    problems = incompatibilities(reader, writer)
    assert (problems == []) == compatible, problems
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(writer), datum)
    buf.seek(0)
    if compatible:  # what we accept, fastavro reads
        fastavro.schemaless_reader(
            buf, fastavro.parse_schema(writer), fastavro.parse_schema(reader)
        )
    else:
        try:
            fastavro.schemaless_reader(
                buf, fastavro.parse_schema(writer), fastavro.parse_schema(reader)
            )
        except Exception:
            return
        # fastavro read this one datum, yet another datum of the writer would fail:
        # enum symbols, union branches, promotions the reader lacks
        assert problems


def call(url: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method)
    request.add_header("Content-Type", "application/vnd.schemaregistry.v1+json")
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_levels_are_enforced_on_register():
    v1 = rec(f("a", "int"))
    v2 = rec(f("a", "int"), f("b", "string"))  # a new field without a default
    with SchemaRegistryStandIn() as sr:
        assert call(sr.url, "POST", "/subjects/s/versions", {"schema": json.dumps(v1)}) == (
            200,
            {"id": 1},
        )
        status, body = call(sr.url, "POST", "/subjects/s/versions", {"schema": json.dumps(v2)})
        assert (status, body["error_code"]) == (409, 409)
        assert call(sr.url, "PUT", "/config/s", {"compatibility": "FORWARD"})[0] == 200
        assert call(sr.url, "POST", "/subjects/s/versions", {"schema": json.dumps(v2)}) == (
            200,
            {"id": 2},
        )
        assert call(sr.url, "GET", "/subjects/s/versions") == (200, [1, 2])
        status, body = call(sr.url, "POST", "/subjects/s/versions", {"schema": "{not json"})
        assert (status, body["error_code"]) == (422, 42201)
        assert call(sr.url, "GET", "/schemas/ids/9")[1]["error_code"] == 40403
        assert call(sr.url, "GET", "/subjects/nope/versions/latest")[1]["error_code"] == 40401
