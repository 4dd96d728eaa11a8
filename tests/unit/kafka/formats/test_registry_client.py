"""The async registry client against the stand-in: caching, retries, auth, errors."""

from __future__ import annotations

import orjson
import pytest

from aiostream_ckpt.connectors.kafka.formats import (
    Schema,
    SchemaNotFoundError,
    SchemaRegistry,
    SchemaRegistryError,
)
from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt_dev.schema_registry import SchemaRegistryStandIn
from tests.schema_helpers import PV_BAD, PV_V1, PV_V2


def avro(schema: dict) -> Schema:
    return Schema(orjson.dumps(schema).decode())


async def test_register_lookup_by_id_and_versions(stand_in):
    async with SchemaRegistry(stand_in.url).client() as client:
        sid = await client.register("pv-value", avro(PV_V1))
        assert await client.register("pv-value", avro(PV_V1)) == sid  # cached
        assert await client.register("other-value", avro(PV_V1)) == sid  # ids are global
        v2 = await client.register("pv-value", avro(PV_V2))
        assert v2 != sid
        assert await client.versions("pv-value") == [1, 2]
        latest = await client.version("pv-value")
        assert (latest.schema_id, latest.version) == (v2, 2)
        found = await client.lookup("pv-value", avro(PV_V1))
        assert (found.schema_id, found.version) == (sid, 1)
        assert orjson.loads((await client.schema_by_id(v2)).schema) == PV_V2
    gets = [p for m, p in stand_in.state.requests if m == "GET" and "/ids/" in p]
    assert gets == []  # ids the client registered are known without asking


async def test_schema_by_id_is_cached_for_good(stand_in):
    async with SchemaRegistry(stand_in.url).client() as writer:
        sid = await writer.register("pv-value", avro(PV_V1))
    async with SchemaRegistry(stand_in.url).client() as reader:
        for _ in range(3):
            assert (await reader.schema_by_id(sid)).schema_type == "AVRO"
    assert stand_in.state.requests.count(("GET", f"/schemas/ids/{sid}")) == 1


async def test_incompatible_schema_is_refused_with_the_reason(stand_in):
    async with SchemaRegistry(stand_in.url).client() as client:
        await client.register("pv-value", avro(PV_V1))
        assert await client.is_compatible("pv-value", avro(PV_V2))
        assert not await client.is_compatible("pv-value", avro(PV_BAD))
        with pytest.raises(SchemaRegistryError) as exc:
            await client.register("pv-value", avro(PV_BAD))
    assert exc.value.status == 409
    assert "user: the reader's field has no default" in str(exc.value)
    assert not exc.value.retriable


async def test_unknown_ids_and_subjects_are_not_found(stand_in):
    async with SchemaRegistry(stand_in.url).client() as client:
        with pytest.raises(SchemaNotFoundError) as exc:
            await client.schema_by_id(77)
        assert exc.value.error_code == 40403
        with pytest.raises(SchemaNotFoundError) as exc:
            await client.version("nope-value")
        assert exc.value.error_code == 40401


async def test_outages_are_retried_with_backoff_then_reported(stand_in):
    registry = SchemaRegistry(stand_in.url, retries=3, backoff_s=0.01)
    async with registry.client() as client:
        stand_in.fail_next(3, 503)
        assert await client.register("pv-value", avro(PV_V1)) == 1  # 4th attempt
        stand_in.fail_next(4, 503)
        with pytest.raises(SchemaRegistryError) as exc:
            await client.register("pv-value", avro(PV_V2))
    assert exc.value.retriable
    assert "failed after 4 attempts: HTTP 503" in str(exc.value)


async def test_unreachable_registry_names_itself():
    registry = SchemaRegistry("http://127.0.0.1:9", retries=1, backoff_s=0.01, timeout_s=2)
    async with registry.client() as client:
        with pytest.raises(SchemaRegistryError, match=r"127\.0\.0\.1:9.*2 attempts"):
            await client.schema_by_id(1)


async def test_basic_auth_and_bearer_token(tmp_path, monkeypatch):
    with SchemaRegistryStandIn(users={"alice": "s3cret-pw"}) as server:
        ok = SchemaRegistry(server.url, basic_auth="alice:s3cret-pw")
        async with ok.client() as client:
            assert await client.register("s-value", avro(PV_V1)) == 1
        wrong = SchemaRegistry(server.url, basic_auth="alice:nope")
        async with wrong.client() as client:
            with pytest.raises(SchemaRegistryError) as exc:
                await client.schema_by_id(1)
        assert exc.value.status == 401 and not exc.value.retriable
        assert "nope" not in str(exc.value)
        secret = tmp_path / "basic"
        secret.write_text("alice:s3cret-pw\n")
        async with SchemaRegistry(server.url, basic_auth_file=secret).client() as client:
            assert (await client.schema_by_id(1)).schema_type == "AVRO"
        monkeypatch.setenv("SR_AUTH", "alice:s3cret-pw")
        async with SchemaRegistry(server.url, basic_auth_env="SR_AUTH").client() as client:
            assert (await client.schema_by_id(1)).schema_type == "AVRO"
    with SchemaRegistryStandIn(token="tok-123") as server:
        async with SchemaRegistry(server.url, bearer_token="tok-123").client() as client:
            assert await client.register("s-value", avro(PV_V1)) == 1


def test_credentials_never_in_repr_and_bad_configs_refused(tmp_path):
    registry = SchemaRegistry("http://r:8081", basic_auth="alice:s3cret-pw")
    assert "s3cret" not in repr(registry)
    assert "tok-123" not in repr(SchemaRegistry("http://r:8081", bearer_token="tok-123"))
    with pytest.raises(ConfigError, match="http"):
        SchemaRegistry("r:8081")
    with pytest.raises(ConfigError, match="not both"):
        SchemaRegistry("http://r:8081", basic_auth="a:b", bearer_token="t")
    with pytest.raises(ConfigError, match="cannot read"):
        SchemaRegistry("http://r:8081", basic_auth_file=tmp_path / "missing").client()
    with pytest.raises(ConfigError, match="user:password"):
        SchemaRegistry("http://r:8081", basic_auth="no-colon").client()
