"""Records into Arrow tables under one schema: declared, or inferred once and then enforced.

The Parquet and Delta sinks take JSON-like records (dicts) and write columns.
Their schema is either declared (an Arrow schema, or a record type: a
dataclass, ``TypedDict``, ``NamedTuple`` or ``msgspec.Struct`` whose
annotations say each field's type) or inferred from the first batch and
kept from then on: in the writer's state, and in the table once one exists.

A record fits the schema when it is a mapping whose keys are fields of the
schema, every non-nullable field has a value, and every value has the
field's type or one Arrow converts to it without loss (an int into a float
column, a float with no fraction into an int column). ``pyarrow`` alone
would silently truncate 1.5 into an int column and drop unknown keys, so
each batch is built column by column with inferred types and then cast
safely. A record that does not fit goes to the writer's ``record_failed``
(the dead-letter output, with the reason) before anything of its batch is
written, as a serializer's error does.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import types
import typing
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Union

from aiostream_ckpt.connectors.base import RecordErrorFn
from aiostream_ckpt.errors import ConfigError, ConnectorError

try:
    import pyarrow as pa
except ImportError as _exc:  # pragma: no cover - the extra is installed in dev
    raise ConfigError(
        "the Parquet and Delta sinks need pyarrow: pip install 'aiostream-ckpt[parquet]'"
    ) from _exc

__all__ = [
    "RecordSchema",
    "SchemaDeclaration",
    "SchemaMismatch",
    "arrow_schema_of",
    "schema_from_state",
]


class SchemaMismatch(ValueError):
    """A record does not fit the sink's schema.

    Not an :class:`~aiostream_ckpt.errors.AiostreamError`: the fault is the
    record's, as a serializer's ``TypeError`` is, so the task's
    ``errors.on_process_error`` policy may dead-letter it (the engine's own
    errors are never dead-lettered).
    """


#: What converting a record that does not fit raises (SchemaMismatch is a ValueError).
_DOES_NOT_FIT = (pa.ArrowException, TypeError, ValueError, OverflowError)

#: What a sink may be given as its schema.
SchemaDeclaration = Union["pa.Schema", type, None]

_SCALARS: dict[Any, Any] = {
    str: pa.string(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
    bytes: pa.binary(),
    dt.datetime: pa.timestamp("us", tz="UTC"),
    dt.date: pa.date32(),
    Decimal: pa.decimal128(38, 18),
}


def _arrow_type(annotation: Any, where: str) -> tuple[Any, bool]:
    """(Arrow type, nullable) of one annotation; ConfigError for what has no column type."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise ConfigError(f"{where}: a union of {args} has no single column type")
        return _arrow_type(args[0], where)[0], True
    if origin in (list, Sequence, tuple) and origin is not tuple:
        (item,) = typing.get_args(annotation) or (None,)
        if item is None:
            raise ConfigError(f"{where}: say the item type of {annotation!r} (list[int])")
        inner, nullable = _arrow_type(item, where)
        return pa.list_(pa.field("element", inner, nullable=nullable)), False
    if origin is typing.Annotated:
        return _arrow_type(typing.get_args(annotation)[0], where)
    if annotation in _SCALARS:
        return _SCALARS[annotation], False
    raise ConfigError(
        f"{where}: {annotation!r} has no column type (use str, int, float, bool, bytes, "
        "datetime, date, Decimal, list[...] or X | None), or declare a pyarrow schema"
    )


def arrow_schema_of(declared: SchemaDeclaration) -> pa.Schema | None:
    """Return the Arrow schema of a declaration (None: to be inferred).

    >>> from typing import TypedDict
    >>> class PageViews(TypedDict):
    ...     app_id: str
    ...     count: int
    ...     note: str | None
    >>> print(arrow_schema_of(PageViews))
    app_id: string not null
    count: int64 not null
    note: string
    """
    if declared is None or isinstance(declared, pa.Schema):
        return declared
    if not isinstance(declared, type):
        raise ConfigError(f"a sink's schema is a pyarrow schema or a record type, not {declared!r}")
    try:
        hints = typing.get_type_hints(declared, include_extras=True)
    except Exception as exc:
        raise ConfigError(f"cannot read the field types of {declared.__name__}: {exc}") from exc
    if dataclasses.is_dataclass(declared):
        names = [f.name for f in dataclasses.fields(declared)]
    else:
        names = [n for n in hints if not n.startswith("_")]
    if not names:
        raise ConfigError(f"record type {declared.__name__} declares no fields")
    fields = []
    for name in names:
        kind, nullable = _arrow_type(hints[name], f"{declared.__name__}.{name}")
        fields.append(pa.field(name, kind, nullable=nullable))
    return pa.schema(fields)


def schema_to_state(schema: pa.Schema) -> str:
    """Return the schema as a JSON-able string for a writer's checkpointed state."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_state(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def _fits(found: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether values inferred as ``found`` may go into a ``wanted`` column (cast checks values)."""
    if found == wanted or pa.types.is_null(found):
        return True
    t = pa.types
    if t.is_integer(found) or t.is_floating(found):  # 2.0 into an int; 2.5 fails the safe cast
        return bool(t.is_integer(wanted) or t.is_floating(wanted))
    if t.is_string(found) or t.is_large_string(found):
        return bool(t.is_string(wanted) or t.is_large_string(wanted))
    if t.is_timestamp(found):
        return bool(t.is_timestamp(wanted))
    if t.is_list(found) and t.is_list(wanted):
        return _fits(found.value_type, wanted.value_type)
    return bool(t.is_struct(found) and t.is_struct(wanted))  # the cast checks the fields


class RecordSchema:
    """One sink's record schema, and the conversion of batches under it.

    ``exclude``: columns a record must have that are not in the schema's data
    files (none today; kept in the schema, as Delta keeps partition columns).
    """

    def __init__(self, declared: SchemaDeclaration, *, sink: str) -> None:
        self.sink = sink
        self.declared = arrow_schema_of(declared)
        #: the schema in force: declared, adopted (table, restored state) or inferred
        self.schema: pa.Schema | None = self.declared
        self.function = f"schema of sink {sink!r}"

    def adopt(self, schema: pa.Schema, origin: str) -> None:
        """Enforce ``schema`` (a table's or a restored writer's); refuse one that conflicts."""
        if self.declared is not None and not _same_columns(self.declared, schema):
            raise ConnectorError(
                f"sink {self.sink!r}: {origin} has the schema {_describe(schema)}, but the sink "
                f"declares {_describe(self.declared)}; write to another table or declare that "
                "schema",
                retriable=False,
            )
        self.schema = schema

    def to_table(self, rows: list[Any], record_failed: RecordErrorFn) -> pa.Table | None:
        """Return the rows that fit as one table (None: none); the rest go to ``record_failed``."""
        if not rows:
            return None
        if self.schema is None:
            self.schema = self._infer(rows)
        try:
            return self._convert(rows, self.schema)
        except _DOES_NOT_FIT:
            pass  # some record does not fit: find it, one by one
        kept = []
        for rec in rows:
            try:
                self._convert([rec], self.schema)
            except _DOES_NOT_FIT as exc:
                record_failed(self.function, rec, _record_error(exc, self.schema))
                continue
            kept.append(rec)
        return self._convert(kept, self.schema) if kept else None

    def _infer(self, rows: list[Any]) -> pa.Schema:
        names: dict[str, None] = {}
        for rec in rows:
            if isinstance(rec, Mapping):
                names.update(dict.fromkeys(rec))
        if not names:
            raise ConnectorError(
                f"sink {self.sink!r}: cannot infer a schema from records that are not mappings; "
                "declare one",
                retriable=False,
            )
        fields = []
        for name in names:
            values = [rec.get(name) if isinstance(rec, Mapping) else None for rec in rows]
            try:
                kind = pa.array(values).type
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                raise ConnectorError(
                    f"sink {self.sink!r}: cannot infer the type of field {name!r} from the "
                    f"first batch ({exc}); declare the schema",
                    retriable=False,
                ) from exc
            if pa.types.is_null(kind):
                raise ConnectorError(
                    f"sink {self.sink!r}: field {name!r} is null in every record of the first "
                    "batch, so its type cannot be inferred; declare the schema",
                    retriable=False,
                )
            fields.append(pa.field(name, kind))
        return pa.schema(fields)

    @staticmethod
    def _convert(rows: list[Any], schema: pa.Schema) -> pa.Table:
        wanted = set(schema.names)
        for rec in rows:
            if not isinstance(rec, Mapping):
                raise SchemaMismatch(f"a record is a {type(rec).__name__}, not a mapping of fields")
            if not wanted.issuperset(rec):
                extra = sorted(str(k) for k in rec if k not in wanted)
                raise SchemaMismatch(f"field(s) {', '.join(extra)} not in the schema")
        columns = []
        for field in schema:
            values = [rec.get(field.name) for rec in rows]
            found = pa.array(values)
            if not _fits(found.type, field.type):
                raise SchemaMismatch(f"field {field.name!r} is {found.type}, not {field.type}")
            column = found.cast(field.type, safe=True)
            if not field.nullable and column.null_count:
                raise SchemaMismatch(f"field {field.name!r} is missing or null (not nullable)")
            columns.append(column)
        return pa.Table.from_arrays(columns, schema=schema)


def _record_error(exc: BaseException, schema: pa.Schema) -> SchemaMismatch:
    if isinstance(exc, SchemaMismatch):
        return SchemaMismatch(f"record does not fit the schema: {exc}")
    return SchemaMismatch(f"record does not fit the schema {_describe(schema)}: {exc}")


def _same_columns(a: pa.Schema, b: pa.Schema) -> bool:
    """Tell whether the names and types agree (nullability aside: a table may be laxer)."""
    return [(f.name, f.type) for f in a] == [(f.name, f.type) for f in b]


def _describe(schema: pa.Schema) -> str:
    return "{" + ", ".join(f"{f.name}: {f.type}" for f in schema) + "}"
