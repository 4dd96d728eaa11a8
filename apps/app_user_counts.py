"""Counts by two keys, across shards: per app, then per user, through a repartition topic.

The input topic is written by key group of ``app_id`` (so each shard reads
the apps of its key groups); counting per user needs the records keyed by
``user_id``, whose key groups lie in any shard. ``Stream.through`` sends
them across: every shard writes each record, exactly-once, into the
partition of its user's key groups of ``through_topic`` and reads back only
its own partitions (Kafka Streams' repartition topic). Run one daemon per
shard (``--shard I/N``) or one for all.

Every event ``{"app_id", "user_id", ...}`` becomes one output record
``{"app_id", "app_pv", "user_id", "user_n"}``: the event is its app's
``app_pv``-th and its user's ``user_n``-th. Exactly-once end to end means
each app's ``app_pv`` and each user's ``user_n`` run exactly ``1..n`` over
the output, ``n`` the key's count in the input (:func:`check_output`).

Params: ``kafka_bootstrap``, ``input_topic``, ``through_topic``,
``output_topic``; ``stop_at_end=1`` bounds the input (the job still runs
until stopped: the repartition topic has no end).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

from aiostream_ckpt.api import KeyedProcessFunction, StreamEnvironment, ValueStateDescriptor
from aiostream_ckpt.api.functions import Collector, Context, RuntimeContext
from aiostream_ckpt.connectors.kafka.sink import KafkaSink
from aiostream_ckpt.connectors.kafka.source import KafkaSource

app_id = itemgetter("app_id")
user_id = itemgetter("user_id")


class Numbered(KeyedProcessFunction[dict[str, Any], dict[str, Any]]):
    """Numbers each key's records 1, 2, ... in field ``field``."""

    def __init__(self, field: str) -> None:
        self.field = field

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(
        self, value: dict[str, Any], ctx: Context, out: Collector[dict[str, Any]]
    ) -> None:
        n = self.count.value() + 1
        self.count.update(n)
        out.collect({**value, self.field: n})


def _flag(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def build(env: StreamEnvironment) -> None:
    p = env.params
    for key in ("kafka_bootstrap", "input_topic", "through_topic", "output_topic"):
        if key not in p:
            raise ValueError(f"set app.{key}")
    bootstrap = str(p["kafka_bootstrap"])
    source = KafkaSource(
        str(p["input_topic"]),
        bootstrap,
        stop_at_end=_flag(p.get("stop_at_end", "0")),
        required={"app_id": str, "user_id": str},
        key_grouped=True,
    )
    events = env.from_source(source, uid="events")
    by_app = events.reinterpret_as_keyed(app_id).process(Numbered("app_pv"), uid="per-app")
    slim = by_app.map(
        lambda e: {"app_id": e["app_id"], "user_id": e["user_id"], "app_pv": e["app_pv"]},
        uid="slim",
    )
    by_user = slim.through(str(p["through_topic"]), bootstrap, user_id, uid="by-user")
    counted = by_user.process(Numbered("user_n"), uid="per-user")
    sink = KafkaSink(str(p["output_topic"]), bootstrap, key_fn=lambda e: e["user_id"])
    counted.sink_to(sink, uid="out")


def check_output(records: Iterable[dict[str, Any]], events: list[dict[str, Any]]) -> list[str]:
    """Return what is wrong with the output (empty: exactly once), from the input's events."""
    valid = [e for e in events if _valid(e)]
    want = {
        "app": Counter(e["app_id"] for e in valid),
        "user": Counter(e["user_id"] for e in valid),
    }
    seen: dict[tuple[str, str], list[int]] = defaultdict(list)
    records_out = 0
    for r in records:
        records_out += 1
        seen[("app", r["app_id"])].append(r["app_pv"])
        seen[("user", r["user_id"])].append(r["user_n"])
    problems = []
    for kind, counts in want.items():
        for key, n in counts.items():
            got = sorted(seen.get((kind, key), []))
            if got != list(range(1, n + 1)):
                problems.append(f"{kind} {key}: {len(got)} numbers for {n} events")
    if records_out != len(valid):
        problems.append(f"{records_out} records out for {len(valid)} events in")
    return problems


def _valid(e: Any) -> bool:
    return (
        isinstance(e, dict)
        and isinstance(e.get("app_id"), str)
        and isinstance(e.get("user_id"), str)
    )
