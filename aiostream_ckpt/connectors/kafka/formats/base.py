"""What every registry-aware format shares: subjects, schema ids per batch, declared types.

A format is declared with the job (``KafkaSource(value_format=...)``,
``KafkaSink(key_format=...)``) and opened by each reader or writer in the
process that runs it, against a :class:`~.registry.SchemaRegistryClient`:

- a **decoder** (source) turns framed bytes into a record. Its
  :meth:`Decoder.prepare` runs before a fetched batch is decoded and asks the
  registry for the schema ids it has not seen (async, once per id); then
  :meth:`Decoder.decode` is a plain function per record, as a JSON
  deserializer is, so a record that does not decode (not framed, an unknown
  id, a payload its schema cannot read) raises and the source dead-letters it
  with its topic, partition, offset and the reason.
- an **encoder** (sink) registers or looks up its schema under the subject of
  its topic once, at the writer's start, and then frames records with that id.

Records are dicts, or instances of ``record_type`` (a dataclass or a msgspec
``Struct``; ``msgspec.convert`` builds them, :func:`to_plain` takes them apart).
"""

from __future__ import annotations

import datetime
import decimal
import enum
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from aiostream_ckpt.connectors.kafka.formats.registry import (
    Schema,
    SchemaNotFoundError,
    SchemaRegistry,
    SchemaRegistryClient,
    SchemaRegistryError,
)
from aiostream_ckpt.connectors.kafka.formats.wire import HEADER, MAGIC, WireFormatError
from aiostream_ckpt.errors import ConfigError

#: Types a format's codec takes as they are: ``to_plain`` leaves them alone.
_PASS_THROUGH = (
    bytes,
    bytearray,
    datetime.datetime,
    datetime.date,
    datetime.time,
    decimal.Decimal,
    uuid.UUID,
)


class SubjectNameStrategy(enum.Enum):
    """Which registry subject a topic's schemas go under (Confluent's three strategies)."""

    #: ``{topic}-key`` / ``{topic}-value``: one record type per topic (the default)
    TOPIC = "topic"
    #: the record's full name: one type, any topics
    RECORD = "record"
    #: ``{topic}-{record full name}``: several types in one topic
    TOPIC_RECORD = "topic_record"

    def subject(self, topic: str, *, is_key: bool, record_name: str | None) -> str:
        if self is SubjectNameStrategy.TOPIC:
            return f"{topic}-{'key' if is_key else 'value'}"
        if not record_name:
            raise ConfigError(
                f"subject strategy {self.value} needs a record name (an Avro record's "
                "namespace.name, a Protobuf message, a JSON schema's title)"
            )
        if self is SubjectNameStrategy.RECORD:
            return record_name
        return f"{topic}-{record_name}"


def plain_converter(record_type: type | None) -> Callable[[Any], Any] | None:
    """Return a function turning a decoded dict into ``record_type`` (None: keep dicts)."""
    if record_type is None:
        return None
    import msgspec

    def convert(value: Any) -> Any:
        return None if value is None else msgspec.convert(value, record_type)

    return convert


def to_plain(record: Any) -> Any:
    """Return ``record`` (a dataclass or msgspec Struct) as a dict for an encoder."""
    if record.__class__ is dict:
        return record
    import msgspec

    return msgspec.to_builtins(record, builtin_types=_PASS_THROUGH)


class Decoder:
    """Framed bytes to records, with a decode function per schema id (see the module docstring)."""

    def __init__(
        self,
        client: SchemaRegistryClient,
        build: Callable[[int, Schema], Callable[[bytes], Any]],
        what: str,
    ) -> None:
        self._client = client
        self._build = build
        self._what = what
        #: the 4 id bytes of the header -> decode function, or the reason none can be made
        self._fns: dict[bytes, Callable[[bytes], Any]] = {}
        self._bad: dict[bytes, str] = {}

    async def prepare(self, values: list[bytes | None]) -> None:
        """Fetch the schemas of ids in ``values`` not seen yet; registry failures raise."""
        fns, bad = self._fns, self._bad
        new = (
            {v[1:HEADER] for v in values if v is not None and v[:1] == b"\x00"}
            - fns.keys()
            - bad.keys()
        )
        for raw in new:
            if len(raw) < HEADER - 1:
                continue  # too short to be framed: decode says so
            schema_id = int.from_bytes(raw, "big")
            try:
                schema = await self._client.schema_by_id(schema_id)
            except SchemaNotFoundError:
                bad[raw] = f"schema id {schema_id} is not in the schema registry {self._client.url}"
                continue
            except SchemaRegistryError:
                raise
            try:
                fns[raw] = self._build(schema_id, schema)
            except Exception as exc:  # the registered schema is unusable for this reader
                bad[raw] = f"schema id {schema_id}: {type(exc).__name__}: {exc}"

    def decode(self, data: bytes | None) -> Any:
        """Decode one framed record (``None``, a tombstone, stays ``None``)."""
        if data is None:
            return None
        fn = self._fns.get(data[1:HEADER])
        if fn is None or data[0] != MAGIC:
            if len(data) < HEADER or data[0] != MAGIC:
                from aiostream_ckpt.connectors.kafka.formats.wire import schema_id_of

                schema_id_of(data)  # raises the framing error
            reason = self._bad.get(data[1:HEADER])
            schema_id = int.from_bytes(data[1:HEADER], "big")
            raise WireFormatError(
                reason or f"schema id {schema_id} was not fetched before decoding ({self._what})"
            )
        return fn(data)


class RecordFormat(ABC):
    """A registry-aware record format: its schema, subject and declared type."""

    #: the registry's ``schemaType``
    schema_type = "AVRO"
    #: the optional dependency that brings the codec (``pip install aiostream-ckpt[extra]``)
    extra = "avro"

    def __init__(
        self,
        registry: SchemaRegistry,
        *,
        record_type: type | None = None,
        subject_strategy: SubjectNameStrategy | str = SubjectNameStrategy.TOPIC,
        subject: str | None = None,
        auto_register: bool = True,
        use_latest: bool = False,
    ) -> None:
        if not isinstance(registry, SchemaRegistry):
            raise ConfigError(f"{type(self).__name__} needs a SchemaRegistry, got {registry!r}")
        try:
            self.subject_strategy = SubjectNameStrategy(subject_strategy)
        except ValueError:
            choices = ", ".join(s.value for s in SubjectNameStrategy)
            raise ConfigError(f"subject_strategy must be one of {choices}") from None
        self.registry = registry
        self.record_type = record_type
        self.subject = subject
        self.auto_register = auto_register
        self.use_latest = use_latest
        self._check_codec()

    def _check_codec(self) -> None:
        """Raise ``ConfigError`` naming the extra to install when the codec is missing."""
        try:
            self._import_codec()
        except ImportError as exc:
            raise ConfigError(
                f"{type(self).__name__} needs {exc.name}: "
                f"pip install 'aiostream-ckpt[{self.extra}]'"
            ) from None

    @abstractmethod
    def _import_codec(self) -> None:
        """Import the codec library (raises ImportError when it is not installed)."""

    @abstractmethod
    def writer_schema(self) -> Schema | None:
        """Return the schema a sink writes with (None: the subject's latest, ``use_latest``)."""

    @abstractmethod
    def record_name(self) -> str | None:
        """Return the full name the RECORD strategies name the subject by."""

    @abstractmethod
    def decode_function(self, schema_id: int, schema: Schema) -> Callable[[bytes], Any]:
        """Return the function decoding records framed with ``schema_id``."""

    @abstractmethod
    def encode_function(self, schema_id: int, schema: Schema) -> Callable[[Any], bytes]:
        """Return the function encoding records with ``schema`` framed as ``schema_id``."""

    async def references(self, client: SchemaRegistryClient) -> Schema | None:
        """Return the writer schema, its references registered first (Protobuf imports)."""
        return self.writer_schema()

    def subject_for(self, topic: str, *, is_key: bool) -> str:
        return self.subject or self.subject_strategy.subject(
            topic, is_key=is_key, record_name=self.record_name()
        )

    def check_schema_type(self, schema_id: int, schema: Schema) -> None:
        if schema.schema_type != self.schema_type:
            raise WireFormatError(
                f"schema id {schema_id} is {schema.schema_type}; this format reads "
                f"{self.schema_type}"
            )

    async def decoder(self, client: SchemaRegistryClient) -> Decoder:
        """Return the source side: a decoder fetching writer schemas by id as records need them."""
        return Decoder(client, self.decode_function, type(self).__name__)

    async def encoder(
        self, client: SchemaRegistryClient, topic: str, *, is_key: bool
    ) -> Callable[[Any], bytes]:
        """Return the sink side's encoder, its schema registered (or looked up) once."""
        subject = self.subject_for(topic, is_key=is_key)
        schema = await self.references(client)
        try:
            if schema is None:  # use_latest
                found = await client.version(subject, "latest")
                schema_id, schema = found.schema_id, found.schema
            elif self.auto_register:
                schema_id = await client.register(subject, schema)
            else:
                schema_id = (await client.lookup(subject, schema)).schema_id
        except SchemaRegistryError as exc:
            what = "registering" if schema is not None and self.auto_register else "looking up"
            raise type(exc)(
                f"{type(self).__name__}: {what} the schema of subject {subject!r} failed: {exc}",
                status=exc.status,
                error_code=exc.error_code,
                retriable=exc.retriable,
            ) from exc
        self.check_schema_type(schema_id, schema)
        return self.encode_function(schema_id, schema)
