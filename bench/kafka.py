"""The Kafka path: which systems can run it here, and why the others cannot (yet).

Plug-in points: when ``aiostream_ckpt.connectors.kafka`` gains its source and
two-phase-commit sink, :func:`ours_kafka_reason` returns None and a Kafka
pv_count app runs through :class:`bench.systems.Ours` with ``app=...`` and a
topic workload; ``bare-aiokafka`` (consume → transactional produce),
``quixstreams`` (``processing_guarantee="exactly-once"``) and ``faust``
(``processing_guarantee="exactly_once"``) then run against the same
:class:`~aiostream_ckpt.connectors.kafka.broker.KafkaBroker` and topic, and the
Spark validator reads the output topic ``read_committed``.
"""

from __future__ import annotations

import importlib.util

from bench.results import RunResult, unavailable

KAFKA_SYSTEMS = ("aiostream-ckpt", "bare-aiokafka", "quixstreams", "faust")


def ours_kafka_reason() -> str | None:
    missing = [
        m
        for m in ("source", "sink")
        if importlib.util.find_spec(f"aiostream_ckpt.connectors.kafka.{m}") is None
    ]
    if missing:
        return (
            f"the engine's Kafka {' and '.join(missing)} do not exist yet "
            f"(aiostream_ckpt.connectors.kafka.{missing[0]} is missing); the Kafka path has "
            "no 'ours' to compare against"
        )
    return None


def kafka_runs(experiment: str = "compare") -> list[RunResult]:
    """Results for the Kafka path as far as it can run on this checkout."""
    why = ours_kafka_reason()
    if why is None:
        why = (
            "the engine's Kafka source and sink are in this tree, but the bench's Kafka "
            "workload (topic loader, Kafka pv_count app, runners) is not written yet"
        )
    runs = [unavailable("aiostream-ckpt", "kafka", why, experiment=experiment)]
    peer_reason = (
        "not run: every Kafka figure is reported as a ratio to ours on the Kafka path, and ours "
        "cannot run there yet (" + why.split(";")[0] + ")"
    )
    for name in KAFKA_SYSTEMS[1:]:
        runs.append(unavailable(name, "kafka", peer_reason, experiment=experiment))
    return runs
