"""Per-line parsers that run inside Spark's Python workers.

Lines are parsed with orjson, the parser the job uses, rather than Spark's JSON
reader: Spark accepts ``{"app_id": "a"} trailing`` and turns ``5`` into ``"5"``
for a string column, so it would expect output for lines the job dead-letters.
Kept free of package imports because Spark ships this module by value.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Sequence
from typing import Any

import orjson

BLANK = "blank"
BAD_JSON = "bad_json"
NOT_OBJECT = "not_object"
OK = "ok"

#: Spark schemas of what the parsers below return.
INPUT_SCHEMA = "status string, key string"
COUNT_SCHEMA = "key string, n long, error string"
POSITION_SCHEMA = "src string, off long, error string"
CANONICAL_SCHEMA = "canon string, key string, parsed boolean"

_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_JSON_SPACE = " \t\n\r\x0b\x0c"  # what bytes.isspace() means, as the file source uses


def _is_long(v: Any) -> bool:
    return type(v) is int and _LONG_MIN <= v <= _LONG_MAX


def input_parser(key_field: str) -> Callable[[str | None], tuple[str, str | None]]:
    """Return ``line -> (status, key)``; key is the field's value when it is a string.

    Blank lines are neither events nor dead letters: the file source skips them.
    """

    def parse(line: str | None) -> tuple[str, str | None]:
        if line is None or not line.strip(_JSON_SPACE):
            return BLANK, None
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            return BAD_JSON, None
        if not isinstance(obj, dict):
            return NOT_OBJECT, None
        key = obj.get(key_field)
        return OK, key if isinstance(key, str) else None

    return parse


def count_parser(
    key_field: str, count_field: str
) -> Callable[[str | None], tuple[str | None, int | None, str | None]]:
    """Return ``line -> (key, count, error)`` for running-count output records."""

    def parse(line: str | None) -> tuple[str | None, int | None, str | None]:
        try:
            obj = orjson.loads(line or "")
        except orjson.JSONDecodeError:
            return None, None, "not JSON"
        if not isinstance(obj, dict):
            return None, None, "not a JSON object"
        key, n = obj.get(key_field), obj.get(count_field)
        if not isinstance(key, str):
            return None, None, f"{key_field} is not a string"
        if not _is_long(n):
            return key, None, f"{count_field} is not an integer"
        return key, n, None

    return parse


def position_parser(
    pos_field: str,
) -> Callable[[str | None], tuple[str | None, int | None, str | None]]:
    """Return ``line -> (source name, offset, error)`` from a ``[source, offset]`` field.

    The source is reduced to its base name: the job records the path it was
    given (relative or absolute), the validator is given another spelling.
    """

    def parse(line: str | None) -> tuple[str | None, int | None, str | None]:
        try:
            obj = orjson.loads(line or "")
        except orjson.JSONDecodeError:
            return None, None, "not JSON"
        pos = obj.get(pos_field) if isinstance(obj, dict) else None
        if not (
            isinstance(pos, list) and len(pos) == 2 and isinstance(pos[0], str) and _is_long(pos[1])
        ):
            return None, None, f"no [source, offset] in {pos_field}"
        return source_name(pos[0]), pos[1], None

    return parse


def udf(fn: Callable[[str | None], Any], schema: str) -> Any:
    """Wrap ``fn`` as a plain (pickled) Python UDF.

    Through a lambda: PySpark 4 reads a function's type hints to guess a
    pandas UDF and warns when they are not pandas types.
    """
    from pyspark.sql import functions as F

    return F.udf(lambda line: fn(line), schema)


def source_name(path: str) -> str:
    """Return the name positions are matched by: a file's base name, a topic-partition as is."""
    return posixpath.basename(path.removeprefix("file://")) or path


def canonical(line: bytes, key: str | None, ignore: Sequence[str] = ()) -> tuple[str, Any, bool]:
    """``(canonical text, key value, parsed)``; a line that is not JSON stays as it is.

    Text, not bytes: orjson returns bytes with room to spare (kilobytes each),
    which a million kept records would turn into gigabytes.

    >>> canonical(b'{"pv": 2, "app_id": "a", "t": 9}', "app_id", ("t",))
    ('{"app_id":"a","pv":2}', 'a', True)
    """
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return line.rstrip(b"\r\n").decode("utf-8", errors="replace"), None, False
    if not isinstance(obj, dict):
        return orjson.dumps(obj).decode(), None, True
    for f in ignore:
        obj.pop(f, None)
    k = obj.get(key) if key is not None else None
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode(), k, True


def canonical_parser(
    key: str | None, ignore: Sequence[str]
) -> Callable[[str | None], tuple[str, str | None, bool]]:
    """Return ``line -> (canonical text, key as JSON text, parsed)`` for the proof's Spark path."""

    def parse(line: str | None) -> tuple[str, str | None, bool]:
        canon, k, ok = canonical((line or "").encode(), key, ignore)
        return canon, None if k is None else orjson.dumps(k).decode(), ok

    return parse
