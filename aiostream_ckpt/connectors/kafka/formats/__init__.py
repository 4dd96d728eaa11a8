"""Registry-aware Kafka record formats: Avro, Protobuf and JSON Schema in the Confluent wire format.

``KafkaSource(value_format=..., key_format=...)`` and the same on
``KafkaSink`` (see :mod:`.base`). Each codec is an optional dependency:
``pip install 'aiostream-ckpt[avro]'`` (fastavro), ``[protobuf]``,
``[jsonschema]``; declaring a format without it is a ``ConfigError`` naming
the extra.
"""

from aiostream_ckpt.connectors.kafka.formats.avro import AvroFormat
from aiostream_ckpt.connectors.kafka.formats.base import RecordFormat, SubjectNameStrategy
from aiostream_ckpt.connectors.kafka.formats.json_schema import JsonSchemaFormat
from aiostream_ckpt.connectors.kafka.formats.protobuf import ProtobufFormat
from aiostream_ckpt.connectors.kafka.formats.registry import (
    Schema,
    SchemaNotFoundError,
    SchemaReference,
    SchemaRegistry,
    SchemaRegistryClient,
    SchemaRegistryError,
)
from aiostream_ckpt.connectors.kafka.formats.wire import WireFormatError

__all__ = [
    "AvroFormat",
    "JsonSchemaFormat",
    "ProtobufFormat",
    "RecordFormat",
    "Schema",
    "SchemaNotFoundError",
    "SchemaReference",
    "SchemaRegistry",
    "SchemaRegistryClient",
    "SchemaRegistryError",
    "SubjectNameStrategy",
    "WireFormatError",
]
