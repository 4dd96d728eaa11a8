"""Keyed state of many declared types, read and rewritten on every event.

Each event ``{"k", "seq", "ts"}`` reads the key's state (a datetime, a tuple, a
set, a dataclass, an enum, a list of tuples, a map keyed by enum), emits a
signature of what it read (values *and* their types), and writes the next
state. :func:`step` is the whole logic, pure, so a test can compute the
failure-free output: a value that came back from a checkpoint with another
type (a ``str`` for a ``datetime``, a ``list`` for a ``tuple``) changes the
signature. ``app.rate``: read the input at most that many events per second.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

from aiostream_ckpt.api import KeyedProcessFunction, StreamEnvironment, ValueStateDescriptor
from aiostream_ckpt.api.functions import Collector, Context, RuntimeContext
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from aiostream_ckpt.state.descriptors import ListStateDescriptor, MapStateDescriptor


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Point:
    x: int
    y: float
    at: datetime


#: name -> descriptor type of the value states
VALUES: dict[str, Any] = {
    "last_seen": datetime,
    "pair": tuple[int, str],
    "tags": set[str],
    "point": Point,
    "color": Color,
}


def _sig(value: Any) -> str:
    if isinstance(value, set | frozenset):
        return f"{type(value).__name__}{sorted(value)}"
    if isinstance(value, dict):  # map state iterates in stored-key order
        return f"dict:{sorted(value.items(), key=repr)!r}"
    return f"{type(value).__name__}:{value!r}"


def step(state: dict[str, Any], event: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Return the key's next state and the signature of what ``event`` read."""
    sig = ";".join(_sig(state.get(n)) for n in (*VALUES, "hist", "by_color"))
    seq = int(event["seq"])
    at = datetime.fromtimestamp(event["ts"] / 1000, UTC)
    color = Color.RED if seq % 2 else Color.BLUE
    by_color = dict(state.get("by_color") or {})
    by_color[color] = by_color.get(color, 0) + 1
    new = {
        "last_seen": at,
        "pair": (seq, event["k"]),
        "tags": set(state.get("tags") or ()) | {str(seq % 5)},
        "point": Point(seq, seq / 2, at),
        "color": color,
        "hist": [*(state.get("hist") or [])[-2:], (seq, at)],
        "by_color": by_color,
    }
    return new, sig


class TypedState(KeyedProcessFunction[dict[str, Any], dict[str, Any]]):
    def open(self, ctx: RuntimeContext) -> None:
        self.values = {n: ctx.get_state(ValueStateDescriptor(n, t)) for n, t in VALUES.items()}
        self.hist = ctx.get_state(ListStateDescriptor("hist", tuple[int, datetime]))
        self.by_color = ctx.get_state(MapStateDescriptor("by_color", Color, int))

    def process_element(
        self, value: dict[str, Any], ctx: Context, out: Collector[dict[str, Any]]
    ) -> None:
        state = {n: s.value() for n, s in self.values.items()}
        state["hist"] = self.hist.get() or None
        state["by_color"] = dict(self.by_color.items()) or None
        new, sig = step(state, value)
        for n, s in self.values.items():
            s.update(new[n])
        self.hist.update(new["hist"])
        for color, count in new["by_color"].items():
            self.by_color.put(color, count)
        out.collect({"k": value["k"], "seq": value["seq"], "sig": sig})


def build(env: StreamEnvironment) -> None:
    p = env.params
    rate = float(p["rate"]) if "rate" in p else None
    events = env.from_source(JsonLinesFileSource(str(p["input"]), rate=rate), uid="events")
    events.key_by(itemgetter("k")).process(TypedState(), uid="typed").sink_to(
        ExactlyOnceFileSink(str(p["output"])), uid="typed-sink"
    )
