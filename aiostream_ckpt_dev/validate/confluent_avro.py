"""Confluent-framed Avro values to JSON, for the proof: its own registry reads, no connector code.

The proof reads committed output as a consumer would, sharing no code with
the project's Kafka connectors (:mod:`.proof_kafka`); for an app whose topics
hold Avro in the Confluent wire format it decodes each value here: the
writer schema by id from the registry (``urllib``, cached), fastavro, then
JSON, so the comparison (canonical JSON, per-key order) is the one JSON
topics get. A value that is not framed is kept as it is (compared raw).
"""

from __future__ import annotations

import io
import json
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from aiostream_ckpt_dev.validate.errors import ValidationConfigError

Decode = Callable[[bytes], bytes]


class ConfluentAvroDecoder:
    """``value -> JSON bytes`` for values framed with schema ids of one registry."""

    def __init__(self, registry_url: str) -> None:
        self.registry_url = registry_url
        self._url = registry_url.rstrip("/")
        self._schemas: dict[int, Any] = {}

    def _schema(self, schema_id: int) -> Any:
        found = self._schemas.get(schema_id)
        if found is None:
            import fastavro

            url = f"{self._url}/schemas/ids/{schema_id}"
            with urllib.request.urlopen(url, timeout=30) as resp:
                body = json.loads(resp.read())
            found = self._schemas[schema_id] = fastavro.parse_schema(json.loads(body["schema"]))
        return found

    def __call__(self, value: bytes) -> bytes:
        if value is None or len(value) < 5 or value[0] != 0:
            return value
        import fastavro

        schema = self._schema(int.from_bytes(value[1:5], "big"))
        record = fastavro.schemaless_reader(io.BytesIO(value[5:]), schema, None)
        return orjson.dumps(record)


def value_decoder(
    format_param: str | None, registry_param: str | None, params: Mapping[str, Any]
) -> Decode | None:
    """Return the decoder an app's params call for (None: values are JSON as they are)."""
    if format_param is None or str(params.get(format_param, "json")).lower() == "json":
        return None
    fmt = str(params[format_param]).lower()
    if fmt != "avro":
        raise ValidationConfigError(
            f"the proof reads json or avro topics, not app.{format_param}={fmt}"
        )
    if registry_param is None or registry_param not in params:
        raise ValidationConfigError(f"app.{format_param}=avro needs app.{registry_param}")
    return ConfluentAvroDecoder(str(params[registry_param]))
