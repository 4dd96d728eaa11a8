"""Avro records (fastavro) in the Confluent wire format, with Avro schema resolution.

On a source, ``schema`` is the *reader* schema: every record is decoded with
the writer schema its id names and resolved to ``schema`` by Avro's rules
(fields added with defaults, fields dropped, int promoted to long...), so a
job reads a topic whose producers moved through compatible versions and sees
one shape. Without it, records come as their writer schema made them. On a
sink, ``schema`` is the writer schema, registered (``auto_register``) or
looked up under the topic's subject; ``use_latest=True`` writes with the
subject's latest version instead. A record with a field the schema lacks, or
without one it has no default for, is refused (dead-lettered or failing the
job, by ``errors.on_process_error``): nothing is dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable
from io import BytesIO
from typing import Any

import orjson

from aiostream_ckpt.connectors.kafka.formats.base import RecordFormat, plain_converter, to_plain
from aiostream_ckpt.connectors.kafka.formats.registry import Schema, SchemaRegistry
from aiostream_ckpt.connectors.kafka.formats.wire import HEADER, frame
from aiostream_ckpt.errors import ConfigError


def _parse(schema: Any) -> Any:
    """Parse a schema given as JSON text (the registry's form) or as its parsed JSON."""
    import fastavro

    if isinstance(schema, bytes) or (isinstance(schema, str) and schema[:1] in ('"', "{", "[")):
        schema = orjson.loads(schema)
    return fastavro.parse_schema(schema)


class AvroFormat(RecordFormat):
    """Avro values or keys behind a schema registry; see the module docstring."""

    schema_type = "AVRO"
    extra = "avro"

    def __init__(
        self,
        registry: SchemaRegistry,
        schema: str | dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(registry, **options)
        self._raw: Any = None
        self._parsed: Any = None
        if schema is not None:
            try:
                self._raw = orjson.loads(schema) if isinstance(schema, str | bytes) else schema
                self._parsed = _parse(self._raw)  # a primitive ("string") parses as its name
            except Exception as exc:
                raise ConfigError(f"AvroFormat: invalid Avro schema: {exc}") from None

    def _import_codec(self) -> None:
        import fastavro  # noqa: F401

    def writer_schema(self) -> Schema | None:
        if self._raw is None:
            if not self.use_latest:
                raise ConfigError("AvroFormat on a sink needs a schema (or use_latest=True)")
            return None
        return Schema(orjson.dumps(self._raw).decode(), "AVRO")

    def record_name(self) -> str | None:
        raw = self._raw
        if not isinstance(raw, dict) or "name" not in raw:
            return None
        name = str(raw["name"])
        namespace = raw.get("namespace")
        return name if "." in name or not namespace else f"{namespace}.{name}"

    def decode_function(self, schema_id: int, schema: Schema) -> Callable[[bytes], Any]:
        from fastavro import schemaless_reader

        self.check_schema_type(schema_id, schema)
        writer = _parse(schema.schema)
        reader = self._parsed
        if reader is not None and orjson.dumps(writer) == orjson.dumps(reader):
            reader = None  # same schema: no resolution step
        convert = plain_converter(self.record_type)

        def decode(data: bytes) -> Any:
            buf = BytesIO(data)
            buf.seek(HEADER)
            value = schemaless_reader(buf, writer, reader)
            if buf.tell() != len(data):
                raise ValueError(
                    f"{len(data) - buf.tell()} bytes left after the record (schema id {schema_id})"
                )
            return value if convert is None else convert(value)

        return decode

    def encode_function(self, schema_id: int, schema: Schema) -> Callable[[Any], bytes]:
        from fastavro import schemaless_writer

        self.check_schema_type(schema_id, schema)
        parsed = _parse(schema.schema)
        header = frame(schema_id)

        def encode(record: Any) -> bytes:
            buf = BytesIO()
            buf.write(header)
            schemaless_writer(buf, parsed, to_plain(record), strict_allow_default=True)
            return buf.getvalue()

        return encode
