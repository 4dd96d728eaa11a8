"""Per-key event-time tumbling window counts, with very late records on a side output.

``app.input``: JSON-lines file(s) of ``{"k", "ts"}``; ``app.output``: window counts
``{"k", "start", "n"}``; ``app.late_output``: the late records; ``app.rate``: read
each input at most that many events per second; ``app.lateness``: the allowed
lateness in ms (0; the input has no record for a fired window but the very
late ones, so the output does not depend on it). Used by the kill -9 test that
lateness is decided the same way with and without failures, and by the one of
a savepoint restored with another allowed lateness.
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
    CountAggregate,
    OutputTag,
    ProcessWindowFunction,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)

WINDOW_MS = 10_000
MAX_DELAY_MS = 1_000
#: How far behind the newest event a very late record is: past any window's end.
LATE_BY_MS = 600_000


class Describe(ProcessWindowFunction):  # type: ignore[type-arg]
    def process(self, key: Any, context: Any, elements: Any, out: Any) -> None:
        for n in elements:
            out.collect({"k": key, "start": context.window.start, "n": n})


def generate(n: int, *, seed: int, late_every: int, keys: int = 20) -> list[dict[str, Any]]:
    """``n`` events 10 ms apart; every ``late_every``-th (after the first 2,000) very late.

    The very late ones are late whatever the batching: LATE_BY_MS is far more
    than the watermark can lag behind (one batch plus MAX_DELAY_MS).
    """
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ts = LATE_BY_MS + i * 10
        if i >= 2_000 and i % late_every == 0:
            out.append({"k": f"k{rng.randrange(keys)}", "ts": ts - LATE_BY_MS, "late": i})
        else:
            out.append({"k": f"k{rng.randrange(keys)}", "ts": ts})
    return out


def expected(events: list[dict[str, Any]]) -> tuple[dict[tuple[str, int], int], list[int]]:
    """Window counts of the on-time events, and the ids of the late ones."""
    counts: dict[tuple[str, int], int] = {}
    late = []
    for e in events:
        if "late" in e:
            late.append(e["late"])
        else:
            w = (e["k"], e["ts"] - e["ts"] % WINDOW_MS)
            counts[w] = counts.get(w, 0) + 1
    return counts, late


def write(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    return path


def build(env: StreamEnvironment) -> None:
    p = env.params
    late = OutputTag("late")
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(MAX_DELAY_MS).with_timestamp_assigner(
        itemgetter("ts")
    )
    rate = float(p["rate"]) if "rate" in p else None
    source = JsonLinesFileSource([s for s in str(p["input"]).split(",") if s], rate=rate)
    windows = (
        env.from_source(source, uid="events", watermark_strategy=strategy)
        .key_by(itemgetter("k"))
        .window(TumblingEventTimeWindows.of(WINDOW_MS))
        .allowed_lateness(int(p.get("lateness", 0)))
        .side_output_late_data(late)
        .aggregate(CountAggregate(), Describe(), uid="counts")
    )
    windows.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="counts-sink")
    windows.get_side_output(late).sink_to(
        ExactlyOnceFileSink(str(p["late_output"])), uid="late-sink"
    )
