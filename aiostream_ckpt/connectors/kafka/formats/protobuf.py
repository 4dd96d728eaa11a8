"""Protobuf messages in the Confluent wire format, with message indexes and imports as references.

The message type is the generated class (``message_type=Order``): a source
parses every record with it, as Confluent's ``ProtobufDeserializer`` does,
after checking the registry holds a PROTOBUF schema under the record's id;
fields unknown to the class are kept by protobuf and dropped from dicts.
A sink registers the class's ``.proto`` file as Confluent's serializer does
(the ``FileDescriptorProto``, base64), each import first under its file name
as a reference (``google/protobuf/*`` and other well-known files excepted),
and writes the message's path in its file (the message indexes).

Records: ``output="dict"`` (the default) gives plain dicts (field names as in
the ``.proto``, enums by name, int64 as ``int``, unset message fields
``None``) or, with ``record_type``, dataclasses/Structs built from them;
``output="message"`` gives the parsed message objects. A sink takes messages
of the class, dicts (keyword arguments of the class) or declared types.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from aiostream_ckpt.connectors.kafka.formats.base import RecordFormat, plain_converter, to_plain
from aiostream_ckpt.connectors.kafka.formats.registry import (
    Schema,
    SchemaReference,
    SchemaRegistry,
    SchemaRegistryClient,
)
from aiostream_ckpt.connectors.kafka.formats.wire import (
    HEADER,
    decode_message_indexes,
    encode_message_indexes,
    frame,
)
from aiostream_ckpt.errors import ConfigError

_BUILTIN = ("confluent/", "google/protobuf/", "google/type/")


def message_indexes(descriptor: Any) -> list[int]:
    """Return the path of a message type in its file: top-level index, then nested ones."""
    path: list[int] = []
    current = descriptor
    while current.containing_type is not None:
        parent = current.containing_type
        path.insert(0, [d.full_name for d in parent.nested_types].index(current.full_name))
        current = parent
    path.insert(0, list(descriptor.file.message_types_by_name).index(current.name))
    return path


def message_to_dict(message: Any) -> dict[str, Any]:
    """Every field of ``message`` (unset ones at their defaults; unset messages ``None``)."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            vfield = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _single(vfield, v) for k, v in value.items()}
        elif _is_repeated(field):
            out[field.name] = [_single(field, v) for v in value]
        elif field.message_type is not None:
            out[field.name] = message_to_dict(value) if message.HasField(field.name) else None
        else:
            out[field.name] = _single(field, value)
    return out


def _is_repeated(field: Any) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf >= 5.29; ``label`` is deprecated
    return bool(repeated) if repeated is not None else field.label == field.LABEL_REPEATED


def _single(field: Any, value: Any) -> Any:
    if field.message_type is not None:
        return message_to_dict(value)
    if field.enum_type is not None:
        found = field.enum_type.values_by_number.get(value)
        return found.name if found is not None else value
    return value


def dict_to_message(cls: Any, value: dict[str, Any]) -> Any:
    """Build a message from a dict as :func:`message_to_dict` makes them (``None`` is unset)."""
    return cls(**{k: v for k, v in value.items() if v is not None})


class ProtobufFormat(RecordFormat):
    """Protobuf values or keys behind a schema registry; see the module docstring."""

    schema_type = "PROTOBUF"
    extra = "protobuf"

    def __init__(
        self,
        registry: SchemaRegistry,
        message_type: type,
        *,
        output: str = "dict",
        **options: Any,
    ) -> None:
        super().__init__(registry, **options)
        if not hasattr(message_type, "DESCRIPTOR") or not hasattr(message_type, "FromString"):
            raise ConfigError(
                f"ProtobufFormat needs a generated message class, got {message_type!r}"
            )
        if output not in ("dict", "message"):
            raise ConfigError(f"ProtobufFormat output must be 'dict' or 'message', got {output!r}")
        if output == "message" and options.get("record_type") is not None:
            raise ConfigError("ProtobufFormat: record_type needs output='dict'")
        self.message_type = message_type
        self.output = output
        self._indexes = encode_message_indexes(message_indexes(message_type.DESCRIPTOR))

    def _import_codec(self) -> None:
        import google.protobuf  # noqa: F401

    def writer_schema(self) -> Schema | None:
        return _file_schema(self.message_type.DESCRIPTOR.file, ())

    def record_name(self) -> str | None:
        return str(self.message_type.DESCRIPTOR.full_name)

    async def references(self, client: SchemaRegistryClient) -> Schema | None:
        return await _register_file(
            client, self.message_type.DESCRIPTOR.file, register=self.auto_register
        )

    def decode_function(self, schema_id: int, schema: Schema) -> Callable[[bytes], Any]:
        self.check_schema_type(schema_id, schema)
        parse = self.message_type.FromString
        as_dict = self.output == "dict"
        convert = plain_converter(self.record_type)

        def decode(data: bytes) -> Any:
            _, start = decode_message_indexes(data, HEADER)
            message = parse(data[start:])
            if not as_dict:
                return message
            value = message_to_dict(message)
            return value if convert is None else convert(value)

        return decode

    def encode_function(self, schema_id: int, schema: Schema) -> Callable[[Any], bytes]:
        self.check_schema_type(schema_id, schema)
        cls = self.message_type
        header = frame(schema_id) + self._indexes

        def encode(record: Any) -> bytes:
            if not isinstance(record, cls):
                record = dict_to_message(cls, to_plain(record))
            return header + bytes(record.SerializeToString())

        return encode


def _file_schema(file: Any, references: tuple[SchemaReference, ...]) -> Schema:
    return Schema(
        base64.standard_b64encode(file.serialized_pb).decode("ascii"), "PROTOBUF", references
    )


async def _register_file(client: SchemaRegistryClient, file: Any, *, register: bool) -> Schema:
    """Return the file's schema, its imports registered (or looked up) first by file name."""
    refs = []
    for dep in file.dependencies:
        if dep.name.startswith(_BUILTIN):
            continue
        schema = await _register_file(client, dep, register=register)
        if register:
            await client.register(dep.name, schema)
        found = await client.lookup(dep.name, schema)
        refs.append(SchemaReference(dep.name, dep.name, found.version))
    return _file_schema(file, tuple(refs))
