"""Page views per ``app_id`` (the running example of seeds/003).

Every event ``{"app_id": ..., ...}`` adds one to its app's count and emits the
update ``{"app_id": ..., "pv": n}``. The count lives in keyed state, so after a
crash the job resumes from the checkpointed counts and source offsets and the
committed output is exactly that of a failure-free run.

Params (``[app]`` in the config or ``--set app.KEY=VALUE``):

- ``input``: JSON-lines file(s), comma-separated; or ``generate=N`` for N
  generated events (``seed``, ``keys``; ``splits`` to read them in parallel).
  ``rate``: events per second per split (file) to pace them, e.g. in the
  container or under kill -9 tests.
- ``key_grouped=1``: ``input`` is partitioned by key group (files named
  ``kg-<start>-<end>-of-<max>...``, as ``write_key_grouped`` writes them):
  the count reads it with ``reinterpret_as_keyed``, chained to the source,
  without a shuffle.
- ``slow_ms``: each event first waits that many milliseconds in a keyed
  ``map_async`` (``slow_capacity`` at once, default 32), a slow enrichment: the source runs
  into backpressure, so checkpoints meet full channels (what unaligned
  checkpoints are for; the chaos suite's unaligned parts). The output is the same.
- ``output``: directory of the exactly-once file sink; ``roll_size`` (bytes)
  and/or ``roll_interval`` (``"1h"``) let a part file span checkpoints
  (default: one part file per checkpoint and subtask). ``sink=parquet``
  writes Parquet part files there instead, ``sink=delta`` makes it a Delta
  table (the ``parquet`` and ``delta`` extras); both with the declared
  schema ``PageViewCount``.

Kafka mode, when ``kafka_bootstrap`` is set (``host:port``): read JSON events
from ``input_topic``, write ``{"app_id", "pv"}`` to ``output_topic`` keyed by
``app_id`` (one key's updates stay in one partition, in order). Optional:
``stop_at_end=1`` (bounded: stop at the end offsets seen at start),
``kafka_semantic`` (``exactly_once``, the default, or ``at_least_once``),
``transactional_id_prefix``, ``kafka_connect_timeout`` (seconds, default 30),
``group_id`` (commit each completed checkpoint's input offsets to this consumer
group, so ``kafka-consumer-groups.sh --describe`` shows the job's lag),
``format=avro`` with ``schema_registry=<url>`` (values are Avro in the
Confluent wire format: :data:`PAGE_VIEW_SCHEMA` in, :data:`PV_SCHEMA` out;
keys stay the plain ``app_id``), the connection itself from the ``kafka.*``
keys (TLS, SASL),
``key_grouped=1`` (``input_topic`` was written by key group of ``app_id``,
``KafkaSink(partitioner=KeyGroupPartitioner(...))``: the count reads it
without a shuffle, and writes ``output_topic`` the same way).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator, Mapping
from operator import itemgetter
from typing import Any, TypedDict

import orjson

from aiostream_ckpt.api import KeyedProcessFunction, StreamEnvironment, ValueStateDescriptor
from aiostream_ckpt.api.contract import ProofContract
from aiostream_ckpt.api.functions import Collector, Context, RuntimeContext
from aiostream_ckpt.api.stream import KeyedStream, Stream
from aiostream_ckpt.connectors.files import (
    ExactlyOnceFileSink,
    JsonLinesFileSource,
    RollingPolicy,
)
from aiostream_ckpt.connectors.generator import GeneratorSource
from aiostream_ckpt.connectors.key_grouped import KeyGroupPartitioner
from aiostream_ckpt.durations import parse_duration


class PageViewCount(TypedDict):
    """What the count emits: the schema of its Parquet files and Delta table."""

    app_id: str
    pv: int


class CountPageViews(KeyedProcessFunction[dict[str, Any], dict[str, Any]]):
    """pv += 1 per event of the key; emits the new count."""

    def open(self, ctx: RuntimeContext) -> None:
        self.pv = ctx.get_state(ValueStateDescriptor("pv", default=0))

    def process_element(
        self, value: dict[str, Any], ctx: Context, out: Collector[dict[str, Any]]
    ) -> None:
        n = self.pv.value() + 1
        self.pv.update(n)
        out.collect({"app_id": ctx.current_key, "pv": n})


class SlowStep:
    """An event as it is, after ``seconds`` (``app.slow_ms``): a stand-in for a slow lookup."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def __call__(self, event: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(self.seconds)
        return event


def expected_updates(params: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Yield the updates a correct run commits, recounted from the input files without the engine.

    A line counts when it is a JSON object with a string ``app_id`` (the rest
    is dead-lettered); key k's n events give ``{"app_id": k, "pv": 1..n}``.
    """
    counts: Counter[str] = Counter()
    for path in (s for s in str(params["input"]).split(",") if s):
        with open(path, "rb") as f:
            for line in f:
                try:
                    event = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(event, dict) and isinstance(event.get("app_id"), str):
                    counts[event["app_id"]] += 1
    for key, n in counts.items():
        for pv in range(1, n + 1):
            yield {"app_id": key, "pv": pv}


#: Deterministic: a key's updates are 1, 2, ..., n in commit order, whatever the kills.
PROOF = ProofContract(
    outputs=("output",),
    key="app_id",
    oracle=expected_updates,
    kafka_outputs=("output_topic",),
    kafka_inputs=("input_topic",),
    kafka_oracle_input="input",
    kafka_value_format="format",
    kafka_schema_registry="schema_registry",
)

#: Kafka mode, ``app.format=avro``: the input events' Avro schema (the generator's fields)
PAGE_VIEW_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "PageView",
    "namespace": "aiostream.pv",
    "fields": [
        {"name": "app_id", "type": "string"},
        {"name": "user_id", "type": ["null", "string"], "default": None},
        {"name": "ts", "type": ["null", "long"], "default": None},
        {"name": "seq", "type": ["null", "long"], "default": None},
    ],
}

#: Kafka mode, ``app.format=avro``: the output updates' Avro schema
PV_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "PageViewCount",
    "namespace": "aiostream.pv",
    "fields": [{"name": "app_id", "type": "string"}, {"name": "pv", "type": "long"}],
}

#: The key selector; ``itemgetter`` runs in C, a third cheaper than a ``def`` per record.
app_id = itemgetter("app_id")


def _app_id_key(update: dict[str, Any]) -> str:
    return str(update["app_id"])


def _flag(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def build_kafka(env: StreamEnvironment) -> None:
    from aiostream_ckpt.connectors.kafka.sink import KafkaSink
    from aiostream_ckpt.connectors.kafka.source import KafkaSource

    p = env.params
    for key in ("input_topic", "output_topic"):
        if key not in p:
            raise ValueError(f"Kafka mode: set app.{key}")
    bootstrap = str(p["kafka_bootstrap"])
    timeout = float(p.get("kafka_connect_timeout", 30))
    formats = _avro_formats(p)
    source = KafkaSource(
        str(p["input_topic"]),
        bootstrap,
        value_format=formats[0] if formats else None,
        stop_at_end=_flag(p.get("stop_at_end", "0")),
        required={"app_id": str},
        key_grouped=_flag(p.get("key_grouped", "0")),
        group_id=p.get("group_id"),
        connect_timeout_s=timeout,
    )
    sink = KafkaSink(
        str(p["output_topic"]),
        bootstrap,
        semantic=p.get("kafka_semantic", "exactly_once"),  # the sink checks the value
        key_fn=_app_id_key,
        value_format=formats[1] if formats else None,
        partitioner=KeyGroupPartitioner(app_id) if _flag(p.get("key_grouped", "0")) else None,
        transactional_id_prefix=p.get("transactional_id_prefix"),
        connect_timeout_s=timeout,
    )
    events = env.from_source(source, uid="events")
    counts = _keyed(events, p).process(CountPageViews(), uid="pv-count", name="pv-count")
    counts.sink_to(sink, uid="pv-sink")


def _avro_formats(p: Mapping[str, Any]) -> tuple[Any, Any] | None:
    """``app.format=avro``: the source's and the sink's value formats (None: JSON)."""
    fmt = str(p.get("format", "json")).lower()
    if fmt == "json":
        return None
    if fmt != "avro":
        raise ValueError(f"app.format must be json or avro, got {fmt!r}")
    if "schema_registry" not in p:
        raise ValueError("app.format=avro needs app.schema_registry (the registry's URL)")
    from aiostream_ckpt.connectors.kafka.formats import AvroFormat, SchemaRegistry

    registry = SchemaRegistry(str(p["schema_registry"]))
    return AvroFormat(registry, PAGE_VIEW_SCHEMA), AvroFormat(registry, PV_SCHEMA)


def _keyed(events: Stream[Any], p: Mapping[str, Any]) -> KeyedStream[Any, Any]:
    """``key_by(app_id)``, or with ``key_grouped=1`` the input taken as partitioned so already."""
    if _flag(p.get("key_grouped", "0")):
        return events.reinterpret_as_keyed(app_id)
    return events.key_by(app_id)


def event_source(p: dict[str, Any]) -> Any:
    """Return the source of ``app.generate`` or ``app.input`` (the apps on files share it)."""
    rate = float(p["rate"]) if "rate" in p else None
    if "generate" in p:
        return GeneratorSource(
            int(p["generate"]),
            seed=int(p.get("seed", 0)),
            keys=int(p.get("keys", 1000)),
            splits=int(p.get("splits", 1)),
            rate=rate,
        )
    if "input" in p:
        return JsonLinesFileSource(
            [s for s in str(p["input"]).split(",") if s],
            required={"app_id": str},
            key_grouped=_flag(p.get("key_grouped", "0")),
            rate=rate,
        )
    raise ValueError("set app.input (JSON-lines file) or app.generate (event count)")


def build(env: StreamEnvironment) -> None:
    p = env.params
    if "kafka_bootstrap" in p:
        build_kafka(env)
        return
    if "output" not in p:
        raise ValueError("set app.output (the output directory)")
    source = event_source(p)
    events = env.from_source(source, uid="events")
    if "slow_ms" in p:  # behind a keyed edge: its records cross workers (job.workers > 1)
        events = events.key_by(app_id).map_async(
            SlowStep(float(p["slow_ms"]) / 1000),
            capacity=int(p.get("slow_capacity", 32)),
            uid="slow-step",
        )
    counts = _keyed(events, p).process(CountPageViews(), uid="pv-count", name="pv-count")
    counts.sink_to(output_sink(p), uid="pv-sink")


def output_sink(p: Mapping[str, Any]) -> Any:
    """Return the sink ``app.sink`` names (``files``, ``parquet``, ``delta``) at ``app.output``."""
    kind = str(p.get("sink", "files"))
    if kind == "files":
        return ExactlyOnceFileSink(str(p["output"]), rolling=rolling(p))
    if kind == "parquet":
        from aiostream_ckpt.connectors.parquet import ParquetFileSink

        return ParquetFileSink(str(p["output"]), schema=PageViewCount)
    if kind == "delta":
        from aiostream_ckpt.connectors.delta import DeltaSink

        return DeltaSink(str(p["output"]), schema=PageViewCount)
    raise ValueError(f"app.sink is files, parquet or delta, not {kind!r}")


def rolling(p: Mapping[str, Any]) -> RollingPolicy | None:
    """``roll_size`` (bytes) / ``roll_interval`` (``"1h"``): part files span checkpoints."""
    if "roll_size" not in p and "roll_interval" not in p:
        return None
    return RollingPolicy(
        max_bytes=int(p.get("roll_size", 0)),
        max_seconds=parse_duration(p.get("roll_interval", 0)),
    )
