"""A→B transitions per user per event-time hour (the question of seeds/004).

Events ``{"user_id": ..., "event": "A" | "B" | ..., "ts": <ms>}`` arrive out of
order, at most ``max_delay`` ms behind the newest one. Two event-time steps:

1. per user, buffer events until the watermark passes them (a keyed timer per
   timestamp), then replay them in timestamp order and emit a transition
   ``{"user_id", "ts"}`` at every B whose previous event (carried over hour
   boundaries in keyed state) was an A;
2. count transitions per user in tumbling one-hour windows and emit
   ``{"user_id", "hour_start", "transitions"}`` once the hour is complete
   ("has all data for 3-4 pm arrived?" is the watermark passing 4 pm).

Buffers, the previous event, timers and window counts are keyed state, so a
run killed at any moment resumes and commits exactly the failure-free output.

Params (``[app]`` or ``--set app.KEY=VALUE``): ``input`` (JSON-lines files,
comma-separated), ``output`` (directory of the exactly-once file sink),
``max_delay`` (ms of out-of-orderness, default 60000), ``idle_timeout`` (ms,
optional).
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt.api import KeyedProcessFunction, StreamEnvironment
from aiostream_ckpt.api.contract import ProofContract
from aiostream_ckpt.api.functions import Collector, Context, OnTimerContext, RuntimeContext
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from aiostream_ckpt.state.descriptors import MapStateDescriptor, ValueStateDescriptor
from aiostream_ckpt.time import (
    CountAggregate,
    ProcessWindowFunction,
    TumblingEventTimeWindows,
    WatermarkStrategy,
    WindowContext,
)

HOUR_MS = 3_600_000
Event = dict[str, Any]


def event_ts(event: Event) -> int:
    return int(event["ts"])


def user_id(event: Event) -> Any:
    return event["user_id"]


class DetectTransitions(KeyedProcessFunction[Event, Event]):
    """Replays a user's events in timestamp order; emits one record per A→B."""

    def open(self, ctx: RuntimeContext) -> None:
        self.pending = ctx.get_state(MapStateDescriptor("pending"))  # ts -> [event names]
        self.last = ctx.get_state(ValueStateDescriptor("last-event"))

    def process_element(self, value: Event, ctx: Context, out: Collector[Event]) -> None:
        ts = event_ts(value)
        names = self.pending.get(ts)
        self.pending.put(ts, [value["event"]] if names is None else [*names, value["event"]])
        ctx.timer_service().register_event_time_timer(ts)

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector[Event]) -> None:
        names = self.pending.get(timestamp) or []
        self.pending.remove(timestamp)
        last = self.last.value()
        for name in sorted(names):  # equal timestamps: a fixed order, not arrival order
            if last == "A" and name == "B":
                out.collect({"user_id": ctx.current_key, "ts": timestamp})
            last = name
        self.last.update(last)


class HourlyResult(ProcessWindowFunction[int, Event, Any]):
    def process(
        self, key: Any, context: WindowContext, elements: Iterable[int], out: Collector[Event]
    ) -> None:
        for n in elements:
            out.collect({"user_id": key, "hour_start": context.window.start, "transitions": n})


def build(env: StreamEnvironment) -> None:
    p = env.params
    if "output" not in p or "input" not in p:
        raise ValueError("set app.input (JSON-lines files) and app.output (output directory)")
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(
        int(p.get("max_delay", 60_000))
    ).with_timestamp_assigner(event_ts)
    if "idle_timeout" in p:
        strategy = strategy.with_idleness(int(p["idle_timeout"]))
    source = JsonLinesFileSource([s for s in str(p["input"]).split(",") if s])
    events = env.from_source(source, uid="events", watermark_strategy=strategy)
    transitions = events.key_by(user_id).process(DetectTransitions(), uid="transitions")
    hourly = (
        transitions.key_by(user_id)
        .window(TumblingEventTimeWindows.of(HOUR_MS), timestamp_assigner=event_ts)
        .aggregate(CountAggregate(), HourlyResult(), uid="hourly")
    )
    hourly.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="sink")


# -- input generator and reference answer (tests, demos) --------------------------------


def generate_events(
    count: int,
    *,
    users: int = 50,
    max_delay: int = 60_000,
    seed: int = 0,
    start_ms: int = 1_700_000_000_000,
    step_ms: int = 1_000,
    kinds: str = "ABC",
) -> list[Event]:
    """``count`` events in arrival order, each at most ``max_delay`` behind the newest.

    Event time advances ``step_ms`` on average; timestamps are unique per user.
    Arrival order sorts by ``ts + U(0, max_delay)``, so no event is ever older
    than the newest one so far minus ``max_delay``: none is late.

    >>> evs = generate_events(100, max_delay=5_000, seed=1)
    >>> newest = float("-inf")
    >>> all(e["ts"] >= (newest := max(newest, e["ts"])) - 5_000 for e in evs)
    True
    """
    rng = random.Random(seed)
    t = start_ms
    events: list[Event] = []
    for _ in range(count):
        t += rng.randint(1, 2 * step_ms)
        events.append({"user_id": f"u{rng.randrange(users)}", "event": rng.choice(kinds), "ts": t})
    arrival = [(e["ts"] + rng.uniform(0, max_delay), i) for i, e in enumerate(events)]
    return [events[i] for _, i in sorted(arrival)]


def write_events(path: Path, events: Iterable[Event]) -> Path:
    with open(path, "wb") as f:
        f.writelines(orjson.dumps(e) + b"\n" for e in events)
    return path


def read_events(*paths: Path) -> Iterator[Event]:
    for path in paths:
        with open(path, "rb") as f:
            for line in f:
                if line.strip():
                    yield orjson.loads(line)


def expected_transitions(events: Iterable[Event]) -> Counter[tuple[str, int]]:
    """Count by brute force: sort each user's events, count A→B by the B's hour."""
    by_user: dict[str, list[tuple[int, str]]] = {}
    for e in events:
        by_user.setdefault(e["user_id"], []).append((e["ts"], e["event"]))
    counts: Counter[tuple[str, int]] = Counter()
    for user, evs in by_user.items():
        evs.sort()
        for (_, a), (ts, b) in itertools.pairwise(evs):
            if a == "A" and b == "B":
                counts[(user, ts - ts % HOUR_MS)] += 1
    return counts


def expected_output(params: Mapping[str, Any]) -> Iterator[Event]:
    """Yield the hourly records a correct run commits, by brute force over the input files."""
    paths = [Path(s) for s in str(params["input"]).split(",") if s]
    for (user, hour), n in expected_transitions(read_events(*paths)).items():
        yield {"user_id": user, "hour_start": hour, "transitions": n}


#: Deterministic in event time (for input no later than ``max_delay``: none is
#: dropped as late); a user's hours are emitted in time order.
PROOF = ProofContract(outputs=("output",), key="user_id", oracle=expected_output)
