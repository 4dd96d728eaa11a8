"""pv_count Kafka -> Kafka with the count in ``map_async`` (``KeyedAsyncFunction``).

Params as pv_count's Kafka mode: ``kafka_bootstrap``, ``input_topic``,
``output_topic``, ``stop_at_end``; ``latency`` (seconds per awaited call,
default 0.0005). Each event gets ``{"app_id", "pv": n}``, ``n`` its key's
count in the function's value state, written to ``output_topic`` by the
exactly-once (transactional) sink keyed by ``app_id``: per key exactly 1..n.
"""

from __future__ import annotations

from typing import Any

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.kafka.sink import KafkaSink
from aiostream_ckpt.connectors.kafka.source import KafkaSource
from apps.pv_count import app_id
from tests.apps.async_pv_count import CountAfterLookup


def _key(update: dict[str, Any]) -> str:
    return str(update["app_id"])


def build(env: StreamEnvironment) -> None:
    p = env.params
    bootstrap = str(p["kafka_bootstrap"])
    source = KafkaSource(
        str(p["input_topic"]),
        bootstrap,
        stop_at_end=str(p.get("stop_at_end", "0")) == "1",
        required={"app_id": str},
    )
    sink = KafkaSink(str(p["output_topic"]), bootstrap, key_fn=_key)
    counted = (
        env.from_source(source, uid="events")
        .key_by(app_id)
        .map_async(CountAfterLookup(float(p.get("latency", 0.0005))), capacity=64, uid="pv-count")
    )
    counted.sink_to(sink, uid="pv-sink")
