"""Event-time process windows kept as appended chunks: sliding and tumbling, elements kept.

``app.input``: JSON-lines file(s) of ``{"k", "ts", "i"}`` (``i``: the event's
number); ``app.tumbling_output`` / ``app.sliding_output``: one record per
fired window, ``{"k", "start", "end", "ids"}``, ``ids`` the window's events
in the order the window function got them; ``app.rate``: read each input at
most that many events per second; ``app.lateness``: the windows' allowed
lateness in ms (0; with it, fired windows wait in state, their timers stored,
for their cleanup, and an event after its window fired fires it again). Both
window operators keep every element (``ProcessWindowFunction`` without an
aggregate), so a window written to keyed state more than once (at each
barrier, or past the held bound set by ``state.cache_max_entries``, and on
every batch on the sliding windows' general path) is appended to in chunks.
Used by the kill -9 and rescale test of those chunks in checkpoints.
"""

from __future__ import annotations

import random
from operator import itemgetter
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from aiostream_ckpt.time import (
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)

TUMBLING_MS = 20_000
SLIDING_MS, SLIDE_MS = 40_000, 10_000
#: Event time between events, and how far before its place an event's time may be: never
#: late (the watermark trails the newest event by MAX_DELAY_MS)
STEP_MS, MAX_DELAY_MS = 10, 2_000
#: The first event's time: no event time below 0, however early
START_MS = 60_000


class Ids(ProcessWindowFunction):  # type: ignore[type-arg]
    def process(self, key: Any, context: Any, elements: Any, out: Any) -> None:
        window = context.window
        ids = [e["i"] for e in elements]
        out.collect({"k": key, "start": window.start, "end": window.end, "ids": ids})


def generate(n: int, *, seed: int, keys: int = 16, late_by: int = 0) -> list[dict[str, Any]]:
    """``n`` events STEP_MS apart, each up to MAX_DELAY_MS early; keys skewed (1/(rank+1)).

    Skewed: a busy key's window gets many records between two writes, a rare
    key's one or none, so chunks of every size are folded. ``late_by``
    (at most the allowed lateness): one event in 40 is up to that much more
    early, so it may come after its window fired (a late firing, with the
    window's chunks), never after the window's cleanup.
    """
    rng = random.Random(seed)
    names = [f"k{j}" for j in range(keys)]
    weights = [1 / (j + 1) for j in range(keys)]
    out = []
    for i in range(n):
        early = rng.randrange(MAX_DELAY_MS + 1)
        if late_by and i % 40 == 39:
            early += rng.randrange(late_by)
        ts = START_MS + i * STEP_MS - early
        out.append({"k": rng.choices(names, weights)[0], "ts": ts, "i": i})
    return out


def expected(
    events: list[dict[str, Any]],
) -> dict[str, dict[tuple[str, int, int], list[int]]]:
    """Each window's ids in input order (a key's events arrive in it): tumbling and sliding."""
    tumbling: dict[tuple[str, int, int], list[int]] = {}
    sliding: dict[tuple[str, int, int], list[int]] = {}
    for e in events:
        k, ts = e["k"], e["ts"]
        start = ts - ts % TUMBLING_MS
        tumbling.setdefault((k, start, start + TUMBLING_MS), []).append(e["i"])
        last = ts - ts % SLIDE_MS
        for start in range(last, ts - SLIDING_MS, -SLIDE_MS):
            sliding.setdefault((k, start, start + SLIDING_MS), []).append(e["i"])
    return {"tumbling": tumbling, "sliding": sliding}


def write(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    return path


def build(env: StreamEnvironment) -> None:
    p = env.params
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(MAX_DELAY_MS).with_timestamp_assigner(
        itemgetter("ts")
    )
    rate = float(p["rate"]) if "rate" in p else None
    lateness = int(p.get("lateness", 0))
    # 4 KiB blocks (~120 events): the file's read offset, which places the kills, moves
    # with the input (its default 256 KiB blocks are half the input)
    inputs = [s for s in str(p["input"]).split(",") if s]
    source = JsonLinesFileSource(inputs, rate=rate, block_size=4096)
    keyed = env.from_source(source, uid="events", watermark_strategy=strategy).key_by(
        itemgetter("k")
    )
    tumbling = (
        keyed.window(TumblingEventTimeWindows.of(TUMBLING_MS))
        .allowed_lateness(lateness)
        .process(Ids(), uid="tumbling")
    )
    tumbling.sink_to(ExactlyOnceFileSink(str(p["tumbling_output"])), uid="tumbling-sink")
    sliding = (
        keyed.window(SlidingEventTimeWindows.of(SLIDING_MS, SLIDE_MS))
        .allowed_lateness(lateness)
        .process(Ids(), uid="sliding")
    )
    sliding.sink_to(ExactlyOnceFileSink(str(p["sliding_output"])), uid="sliding-sink")
