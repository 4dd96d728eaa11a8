"""Typed state values: msgspec's typed JSON codec against a hand-written one.

``python -m bench.typed_codec [--n N]`` encodes and decodes one typed record (a
dataclass holding a datetime, a tuple, a set and an enum) ``N`` times with
msgspec (``Encoder().encode`` / ``Decoder(type).decode``, what typed state
uses) and with the best hand-written codec on orjson (a ``default`` for the
encoding, a converter per field for the decoding), and prints microseconds per
round trip, best of 5 in CPU time (a busy machine deschedules, so compare two
trees in concurrent runs). The figure behind the choice in
:mod:`aiostream_ckpt.state.codecs`. Then what a state's check at the write
costs (``ValueCodec.capture``, what ``update()``/``put()`` run): an untyped
int, list and dict, that record, a list of 100 tuples, of 100 ``StrEnum``
members, of 100 str, a dict of 20 ints, of 20 frozensets and a list of 100
UUIDs (each container's items are also checked for exact classes, and
positions of a set, a tuple or a UUID for the exact class declared:
:mod:`aiostream_ckpt.state.class_check`).
"""

from __future__ import annotations

import argparse
import enum
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import msgspec
import orjson


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Visit:
    user: str
    seen: datetime
    pair: tuple[int, str]
    tags: frozenset[str]
    color: Color


VALUE = Visit(
    "u-17", datetime(2026, 11, 23, 13, 30, tzinfo=UTC), (3, "x"), frozenset("ab"), Color.RED
)


def _default(obj: Any) -> Any:
    if isinstance(obj, frozenset | set):
        return sorted(obj)
    raise TypeError(type(obj).__name__)


def hand_dumps(value: Visit) -> bytes:
    return orjson.dumps(value, default=_default)


def hand_loads(raw: bytes) -> Visit:
    d = orjson.loads(raw)
    return Visit(
        d["user"],
        datetime.fromisoformat(d["seen"]),
        (int(d["pair"][0]), str(d["pair"][1])),
        frozenset(d["tags"]),
        Color(d["color"]),
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    n = ap.parse_args(argv).n
    enc, dec = msgspec.json.Encoder(), msgspec.json.Decoder(Visit)
    assert dec.decode(enc.encode(VALUE)) == VALUE == hand_loads(hand_dumps(VALUE))
    rows = {
        "msgspec typed JSON": lambda: dec.decode(enc.encode(VALUE)),
        "hand-written on orjson": lambda: hand_loads(hand_dumps(VALUE)),
    }
    for name, fn in rows.items():
        print(f"{name:24s} {_best_us(fn, n):6.2f} us per round trip")
    print("check at the write (ValueCodec.capture):")
    for name, fn in _capture_rows().items():
        print(f"  {name:34s} {_best_us(fn, n // 10):7.2f} us")


def _best_us(fn: Callable[[], object], n: int) -> float:
    return min(timeit.repeat(fn, number=n, repeat=5, timer=time.process_time)) / n * 1e6


class Shade(enum.StrEnum):
    DARK = "dark"
    LIGHT = "light"


def _capture_rows() -> dict[str, Callable[[], object]]:
    from aiostream_ckpt.state.codecs import UNTYPED, value_codec

    hist = [(i, VALUE.seen) for i in range(100)]
    shades = [Shade.DARK, Shade.LIGHT] * 50
    cases: dict[str, tuple[object, object]] = {
        "untyped int": (None, 17),
        "untyped list of 100 ints": (None, list(range(100))),
        "untyped dict of 20 str: list[int]": (None, {f"k{i}": [i, i] for i in range(20)}),
        "Visit": (Visit, VALUE),
        "list[tuple[int, datetime]] x100": (list[tuple[int, datetime]], hist),
        "list[Shade] x100 (StrEnum)": (list[Shade], shades),
        "list[str] x100": (list[str], [f"s{i}" for i in range(100)]),
        "dict[str, int] x20": (dict[str, int], {f"k{i}": i for i in range(20)}),
        "dict[str, frozenset[str]] x20": (
            dict[str, frozenset[str]],
            {f"k{i}": frozenset({"a", f"t{i}"}) for i in range(20)},
        ),
        "list[UUID] x100": (list[UUID], [UUID(int=i) for i in range(100)]),
    }
    rows: dict[str, Callable[[], object]] = {}
    for name, (tp, value) in cases.items():
        codec = UNTYPED if tp is None else value_codec("json", tp, state="s")
        rows[name] = lambda c=codec, v=value: c.capture(v, "s")  # type: ignore[misc]
    return rows


if __name__ == "__main__":
    main()
