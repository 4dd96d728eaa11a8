"""A keyed state of a dataclass whose fields change between runs, for restore tests.

Each event ``{"k", "seq"}`` reads its key's ``Point``, emits what it read (the
fields and the type of ``y``) and writes ``Point(seq, seq / 2)``.
``app.variant`` picks the class, named ``Point`` in every variant:

- ``base``: ``x: int, y: float``;
- ``grown``: ``base`` plus ``label: str = "-"`` (written as ``"grown"``): a
  compatible change, the stored points read back with the default label;
- ``retyped``: ``y: str``: refused at restore (the stored ``y`` are floats;
  without the check the first read of one failed);
- ``widened``: ``x: float``: refused at restore (without the check the stored
  ``x`` silently read back as floats, ``3.0`` for ``3``);
- ``dropped``: ``x: int`` only: a compatible change, but the points it writes
  lack ``y``, so ``base`` after it is refused at restore (without the check
  the first read of such a point failed); ``defaulted`` (``y: float = 0.0``)
  reads them.

``app.key`` picks the stream key: ``k`` (default: the event's ``"k"``,
undeclared), ``n`` (its number, undeclared), ``int`` (its number,
``key_type=int``), ``int?`` (the same, ``key_type=int | None``: widened)
or ``str`` (its number as text, ``key_type=str``: refused at restore after
``int`` or ``n``).

``app.rate``: read the input at most that many events per second.
"""

from __future__ import annotations

from dataclasses import field, make_dataclass
from operator import itemgetter
from typing import Any

from aiostream_ckpt.api import KeyedProcessFunction, StreamEnvironment, ValueStateDescriptor
from aiostream_ckpt.api.functions import Collector, Context, RuntimeContext
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource

POINTS: dict[str, Any] = {
    "base": make_dataclass("Point", [("x", int), ("y", float)]),
    "grown": make_dataclass(
        "Point", [("x", int), ("y", float), ("label", str, field(default="-"))]
    ),
    "retyped": make_dataclass("Point", [("x", int), ("y", str)]),
    "widened": make_dataclass("Point", [("x", float), ("y", float)]),
    "dropped": make_dataclass("Point", [("x", int)]),
    "defaulted": make_dataclass("Point", [("x", int), ("y", float, field(default=0.0))]),
}


class Track(KeyedProcessFunction[dict[str, Any], dict[str, Any]]):
    def __init__(self, variant: str) -> None:
        self.variant = variant
        self.point = POINTS[variant]

    def open(self, ctx: RuntimeContext) -> None:
        self.state = ctx.get_state(ValueStateDescriptor("point", self.point))

    def process_element(
        self, value: dict[str, Any], ctx: Context, out: Collector[dict[str, Any]]
    ) -> None:
        prev = self.state.value()
        read = None
        if prev is not None:
            y = getattr(prev, "y", None)
            read = {"x": prev.x, "y": y, "y_type": type(y).__name__}
            read["label"] = getattr(prev, "label", None)
        out.collect({"k": value["k"], "seq": value["seq"], "read": read})
        seq = int(value["seq"])
        if self.variant == "grown":
            self.state.update(self.point(seq, seq / 2, "grown"))
        elif self.variant == "dropped":
            self.state.update(self.point(seq))
        else:
            self.state.update(
                self.point(seq, str(seq / 2) if self.variant == "retyped" else seq / 2)
            )


def _number(event: dict[str, Any]) -> int:
    return int(event["k"][1:])


KEYS: dict[str, tuple[Any, Any]] = {
    "k": (itemgetter("k"), None),
    "n": (_number, None),
    "int": (_number, int),
    "int?": (_number, int | None),
    "str": (lambda e: e["k"][1:], str),
}


def build(env: StreamEnvironment) -> None:
    p = env.params
    rate = float(p["rate"]) if "rate" in p else None
    events = env.from_source(JsonLinesFileSource(str(p["input"]), rate=rate), uid="events")
    track = Track(str(p.get("variant", "base")))
    selector, key_type = KEYS[str(p.get("key", "k"))]
    events.key_by(selector, key_type=key_type).process(track, uid="track").sink_to(
        ExactlyOnceFileSink(str(p["output"])), uid="track-sink"
    )
