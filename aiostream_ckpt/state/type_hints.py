"""The type to declare for a value an untyped state refused: inferred from the value, then tried.

An untyped state keeps only JSON's own types, and its refusal has to say what
to declare instead. Naming the value's outer class (``dict``) is wrong advice
for a dict holding a datetime: declared as ``dict``, it would not keep the
datetime either. So the hint is the value's whole shape (``dict[str,
datetime.datetime]``), offered only once a typed codec of that shape has
accepted the value. Runs when a write is refused, never per record.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable
from types import GenericAlias
from typing import Any

#: deeper or wider shapes are not guessed at: the hint names the outer class then
_MAX_DEPTH = 4
_MAX_UNION = 3


def infer_type(value: Any, depth: int = 0) -> Any | None:
    """Return the type expression ``value`` is an instance of (None: no single good guess).

    >>> import datetime
    >>> infer_type({"at": datetime.date(2026, 1, 1)})
    dict[str, datetime.date]
    >>> infer_type([(1, "a"), (2, "b")])
    list[tuple[int, str]]
    >>> infer_type([1, None])
    list[int | None]
    >>> infer_type([]) is None
    True
    """
    if depth > _MAX_DEPTH:
        return None
    cls = value.__class__
    if value is None:
        return type(None)
    if dataclasses.is_dataclass(value) or hasattr(cls, "_fields"):  # a NamedTuple
        return cls
    if cls is tuple:
        parts = [infer_type(v, depth + 1) for v in value]
        if not parts or any(p is None for p in parts):
            return None
        return GenericAlias(tuple, tuple(parts))
    if cls in (list, set, frozenset):
        element = _union([infer_type(v, depth + 1) for v in value])
        return None if element is None else GenericAlias(cls, (element,))
    if cls is dict:
        key = _union([infer_type(k, depth + 1) for k in value])
        item = _union([infer_type(v, depth + 1) for v in value.values()])
        return None if key is None or item is None else GenericAlias(dict, (key, item))
    return cls


def _union(types: list[Any]) -> Any | None:
    if not types or any(t is None for t in types):
        return None
    unique = list(dict.fromkeys(types))  # first-seen order: the hint reads like the value
    if len(unique) > _MAX_UNION:
        return None
    nones = [t for t in unique if t is type(None)]
    unique = [t for t in unique if t is not type(None)] + nones  # "int | None"
    return functools.reduce(operator.or_, unique)


def declared_type_hint(value: Any, accepts: Callable[[Any], bool]) -> Any | None:
    """Return a type to declare for ``value``: inferred, then ``accepts(tp)`` (a codec took it)."""
    tp = infer_type(value)
    if tp is None:
        return None
    try:
        return tp if accepts(tp) else None
    except Exception:  # an inferred type the codecs do not support: no hint
        return None
