"""JSON records checked against a JSON Schema (jsonschema), in the Confluent wire format.

The payload after the 5-byte header is plain JSON (orjson). A source checks
each record against the writer schema its id names (``validate=True``, as
Confluent's deserializer does), so a record its producer's schema forbids is
dead-lettered with the validator's message; a sink checks each record against
its own schema before writing it. Subjects: the TOPIC strategy by default;
the RECORD strategies name the subject by the schema's ``title``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from aiostream_ckpt.connectors.kafka.formats.base import RecordFormat, plain_converter, to_plain
from aiostream_ckpt.connectors.kafka.formats.registry import Schema, SchemaRegistry
from aiostream_ckpt.connectors.kafka.formats.wire import HEADER, frame
from aiostream_ckpt.errors import ConfigError


def _validator(schema: Any) -> Any:
    from jsonschema.validators import validator_for

    cls = validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _check(validator: Any, value: Any) -> None:
    error = next(iter(validator.iter_errors(value)), None)
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(the record)"
        raise ValueError(f"does not match its JSON schema at {where}: {error.message}")


class JsonSchemaFormat(RecordFormat):
    """JSON Schema values or keys behind a schema registry; see the module docstring."""

    schema_type = "JSON"
    extra = "jsonschema"

    def __init__(
        self,
        registry: SchemaRegistry,
        schema: str | dict[str, Any] | None = None,
        *,
        validate: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(registry, **options)
        self.validate = validate
        self._raw: Any = None
        if schema is not None:
            try:
                self._raw = orjson.loads(schema) if isinstance(schema, str | bytes) else schema
                _validator(self._raw)
            except Exception as exc:
                raise ConfigError(f"JsonSchemaFormat: invalid JSON schema: {exc}") from None

    def _import_codec(self) -> None:
        import jsonschema  # noqa: F401

    def writer_schema(self) -> Schema | None:
        if self._raw is None:
            if not self.use_latest:
                raise ConfigError("JsonSchemaFormat on a sink needs a schema (or use_latest=True)")
            return None
        return Schema(orjson.dumps(self._raw).decode(), "JSON")

    def record_name(self) -> str | None:
        title = self._raw.get("title") if isinstance(self._raw, dict) else None
        return str(title) if title else None

    def decode_function(self, schema_id: int, schema: Schema) -> Callable[[bytes], Any]:
        self.check_schema_type(schema_id, schema)
        validator = _validator(orjson.loads(schema.schema)) if self.validate else None
        convert = plain_converter(self.record_type)
        loads = orjson.loads

        def decode(data: bytes) -> Any:
            value = loads(memoryview(data)[HEADER:])
            if validator is not None:
                _check(validator, value)
            return value if convert is None else convert(value)

        return decode

    def encode_function(self, schema_id: int, schema: Schema) -> Callable[[Any], bytes]:
        self.check_schema_type(schema_id, schema)
        validator = _validator(orjson.loads(schema.schema)) if self.validate else None
        header = frame(schema_id)
        dumps = orjson.dumps

        def encode(record: Any) -> bytes:
            value = to_plain(record)
            if validator is not None:
                _check(validator, value)
            return header + dumps(value)

        return encode
