"""Recorded type names as a small grammar: which of them read another's stored values.

A checkpoint records each state's declared types by name
(:func:`~aiostream_ckpt.state.class_records.type_key`, ``dict[str,Union[None,int]]``)
and a restore compares them with the job's (:mod:`aiostream_ckpt.state.evolution`).
A name that differs may still read the stored values back unchanged: a union
that holds the old type (``int`` now ``int | None``), a ``Literal`` with more
values, an abstract collection spelled as the one msgspec decodes it into.
Why names and not the types: the old job's classes are gone at a restore;
its checkpoint has only what it recorded.
"""

from __future__ import annotations

import functools
from typing import Any


def wider(a: str, b: str) -> str | None:
    """Return whichever of two recorded types reads the other's stored values, or None."""
    return b if reads_as(a, b) else a if reads_as(b, a) else None


@functools.lru_cache(maxsize=1024)
def reads_as(was: str, now: str) -> bool:
    """Whether values stored under type name ``was`` read back unchanged as ``now``.

    The same name, or ``now`` widens it: a union that holds each of ``was``'s
    members, the same generic over wider arguments, a ``Literal`` with more
    values, a fixed tuple now of any length, an abstract collection spelled
    as the one msgspec decodes it into (``Sequence[int]``: ``list[int]``). A
    class is its own name (its fields are compared by
    :func:`check_class_change`), and a lone class
    gains no class beside it: msgspec tells the classes of a union apart by a
    tag, which values of a class untagged when written lack (a tagged union,
    two classes or more, may gain members).

    >>> reads_as("int", "Union[None,int]"), reads_as("list[int]", "list[Union[NoneType,int]]")
    (True, True)
    >>> reads_as("int", "float"), reads_as("Union[None,int]", "int"), reads_as("A", "Union[A,B]")
    (False, False, False)
    >>> reads_as("Union[A,B]", "Union[A,B,C]"), reads_as("tuple[int,int]", "tuple[int,...]")
    (True, True)
    """
    return was == now or _reads(_parse(was), _parse(now))


#: A parsed type name: (head, arguments); a name without brackets has none.
_Node = tuple[str, tuple[Any, ...] | None]

_BUILTINS = frozenset(
    {
        "None",
        "NoneType",
        "Any",
        "int",
        "float",
        "str",
        "bool",
        "bytes",
        "bytearray",
        "datetime",
        "date",
        "time",
        "timedelta",
        "UUID",
        "Decimal",
        "memoryview",
        "Literal",
        "list",
        "set",
        "frozenset",
        "tuple",
        "dict",
    }
)


def _reads(was: _Node, now: _Node) -> bool:
    if was == now:
        return True
    olds, news = _members(was), _members(now)
    if len(olds) > 1 or len(news) > 1:
        classes = sum(o[0] not in _BUILTINS for o in olds)
        if classes == 1 and any(n[0] not in _BUILTINS for n in news if n not in olds):
            return False  # a class gains a class beside it: see reads_as
        return all(any(_reads(o, n) for n in news) for o in olds)
    (head, args), (now_head, now_args) = was, now
    if head != now_head or args is None or now_args is None:
        return False
    if head == "Literal":
        return set(args) <= set(now_args)
    if head == "tuple" and now_args[-1:] == (_ETC,) and args[-1:] != (_ETC,):
        return all(_reads(a, now_args[0]) for a in args)  # tuple[int, int] -> tuple[int, ...]
    return len(args) == len(now_args) and all(map(_reads, args, now_args))


_ETC: _Node = ("...", None)


def _members(node: _Node) -> tuple[_Node, ...]:
    return node[1] or () if node[0] == "Union" else (node,)


def _parse(name: str) -> _Node:
    """Parse a :func:`type_key`/record name: ``dict[str,Union[None,int]]``."""
    node, end = _parse_at(name, 0)
    return node if end == len(name) else (name, None)  # not ours: compare whole


def _parse_at(name: str, i: int) -> tuple[_Node, int]:
    start, quote = i, ""
    while i < len(name):  # a head, or a Literal's value (a repr: may hold , [ ])
        c = name[i]
        if quote:
            i += 2 if c == "\\" else 1
            quote = "" if c == quote else quote
            continue
        if c in "'\"":
            quote = c
        elif c in ",[]":
            break
        i += 1
    head = unnested(name[start:i])
    if i == len(name) or name[i] != "[":
        return (head, None), i
    args = []
    while name[i] in "[,":
        arg, i = _parse_at(name, i + 1)
        args.append(arg)
        if i == len(name):
            return (name[start:], None), i
    return (_DECODED_AS.get(head, head), tuple(args)), i + 1


def plain_json(name: str) -> bool:
    """Whether values of type ``name`` read back as they were from untyped JSON."""
    return _plain(_parse(name))


def _plain(node: _Node) -> bool:
    head, args = node
    if head in ("Union", "list"):
        return all(map(_plain, args or ()))
    if head == "dict":
        return args is not None and args[0] == ("str", None) and _plain(args[1])
    return (args is None and head in _JSON) or head == "Literal"


def plain_key(name: str) -> bool:
    """Whether stream keys of type ``name`` read back as they were undeclared.

    As :func:`plain_json`, and tuples of such (``tuple[str, int]``,
    ``tuple[int, ...]``): undeclared keys read JSON arrays back as tuples.
    """
    return _plain_key(_parse(name))


def _plain_key(node: _Node) -> bool:
    head, args = node
    if head == "tuple" and args:
        return all(a == ("...", None) or _plain_key(a) for a in args)
    if head == "Union":
        return all(map(_plain_key, args or ()))
    return _plain(node)


_JSON = frozenset({"None", "NoneType", "Any", "int", "float", "str", "bool"})


def unnested(name: str) -> str:
    """Drop the function a class was defined in: ``build.<locals>.Point`` is ``Point``.

    Moving a class out of the function that defined it (or into one) leaves
    its stored values as they were.
    """
    return name.rpartition("<locals>.")[2]


#: Abstract collections by what msgspec decodes them into: ``list[int]`` now
#: ``Sequence[int]`` (or back) reads the same lists.
_DECODED_AS = {
    **dict.fromkeys(["Sequence", "MutableSequence", "Collection"], "list"),
    **dict.fromkeys(["Set", "MutableSet"], "set"),
    **dict.fromkeys(["Mapping", "MutableMapping"], "dict"),
}
