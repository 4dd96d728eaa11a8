"""Typed state values: msgspec's typed JSON codec against a hand-written one.

``python -m bench.typed_codec [--n N]`` encodes and decodes one typed record (a
dataclass holding a datetime, a tuple, a set and an enum) ``N`` times with
msgspec (``Encoder().encode`` / ``Decoder(type).decode``, what typed state
uses) and with the best hand-written codec on orjson (a ``default`` for the
encoding, a converter per field for the decoding), and prints microseconds per
round trip, best of 5. The figure behind the choice in
:mod:`aiostream_ckpt.state.codecs`.
"""

from __future__ import annotations

import argparse
import enum
import timeit
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

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
        best = min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6
        print(f"{name:24s} {best:6.2f} us per round trip")


if __name__ == "__main__":
    main()
