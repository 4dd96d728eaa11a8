"""A replayable Kafka source: explicit partition assignment, offsets in the checkpoint.

Why no consumer group: a group rebalances partitions on its own schedule,
while a checkpointed job must know which instance read which offsets at
barrier n. So, as Flink's KafkaSource does, the job assigns partitions itself
(every partition of the topics, sorted, dealt round-robin over the subtasks),
and the position of each split (``"topic:partition" -> next offset``) goes into
the checkpoint. A restarted reader seeks to its restored offsets; Kafka's
committed group offsets are never read back. With a ``group_id`` (or
``commit_offsets_to_kafka=True``) each completed checkpoint's offsets are
committed to that consumer group, as Flink does, for lag monitoring only:
``kafka-consumer-groups.sh --describe --group G`` and lag exporters then show
how far the job's last completed checkpoint is behind each partition's end.

``read_committed`` is the default isolation: a source must not emit records of
transactions that may still abort (an upstream exactly-once job's in-flight
output).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import orjson

from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.kafka.addresses import check_bootstrap_servers
from aiostream_ckpt.connectors.required import Required
from aiostream_ckpt.errors import ConfigError

if TYPE_CHECKING:
    from aiostream_ckpt.connectors.kafka.formats.base import RecordFormat
    from aiostream_ckpt.connectors.kafka.reader import KafkaSourceReader

Deserializer = Callable[[bytes], Any]
Starting = Literal["earliest", "latest"] | dict[str, int]

#: The shortest fetch wait. ``poll_timeout_ms=0`` made an idle reader return at once,
#: read again, and spin a core; 10 ms costs no latency (records end a wait) and bounds
#: an idle reader to ~100 fetches a second.
MIN_POLL_TIMEOUT_MS = 10


class KafkaSource:
    """Events from Kafka topics; replayable from checkpointed offsets.

    Events are ``deserializer(value)``, or ``(key_deserializer(key), value)``
    pairs when ``key_deserializer`` is given. Records that don't deserialize,
    and values without a ``required`` field (field -> type, as
    :class:`~aiostream_ckpt.connectors.files.JsonLinesFileSource`), go to the
    job's dead-letter output with their topic, partition and offset.

    ``starting`` applies only to a fresh start (no restored position):
    ``"earliest"``, ``"latest"`` or ``{"timestamp": epoch_ms}`` (the first
    offset at or after it). ``stop_at_end`` makes the source bounded: each
    reader captures its partitions' end offsets at start (the last stable
    offset under ``read_committed``) and ends once it has read up to them.
    ``consumer_config`` is passed to ``AIOKafkaConsumer`` (TLS, SASL, fetch sizes).

    ``value_format`` / ``key_format`` read records a schema registry describes
    (:mod:`aiostream_ckpt.connectors.kafka.formats`: Avro, Protobuf, JSON
    Schema in the Confluent wire format) instead of ``deserializer`` /
    ``key_deserializer``; each side takes one or the other. A record that does
    not decode is dead-lettered like malformed JSON, with the reason.

    ``key_grouped=True`` declares the topics partitioned by key group, as a
    ``KafkaSink(partitioner=KeyGroupPartitioner(key))`` writes them with this
    job's ``job.max_parallelism``: each reader then takes the partitions of
    its subtask's key groups instead of round-robin, so
    ``reinterpret_as_keyed(key)`` reads them without a shuffle (a parallelism
    at which a partition's key groups belong to two subtasks is refused; see
    :mod:`aiostream_ckpt.connectors.key_grouped`).

    ``poll_timeout_ms`` is how long a fetch waits when no records are there
    (records end the wait at once), and how long a reader without partitions
    sleeps between looks: at least :data:`MIN_POLL_TIMEOUT_MS`, since a fetch
    that does not wait spins the event loop on an idle topic.
    """

    def __init__(
        self,
        topics: str | Sequence[str],
        bootstrap_servers: str,
        *,
        starting: Starting = "earliest",
        isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed",
        deserializer: Deserializer = orjson.loads,
        key_deserializer: Deserializer | None = None,
        value_format: RecordFormat | None = None,
        key_format: RecordFormat | None = None,
        required: Required | None = None,
        consumer_config: dict[str, Any] | None = None,
        commit_offsets_to_kafka: bool | None = None,
        group_id: str | None = None,
        stop_at_end: bool = False,
        key_grouped: bool = False,
        poll_timeout_ms: int = 100,
        connect_timeout_s: float = 30.0,
        name: str = "kafka-source",
    ) -> None:
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        if not self.topics or len(set(self.topics)) != len(self.topics):
            raise ConfigError(f"KafkaSource needs distinct topic names, got {self.topics}")
        self.bootstrap_servers = check_bootstrap_servers(bootstrap_servers)
        if isinstance(starting, dict):
            if set(starting) != {"timestamp"} or not isinstance(starting["timestamp"], int):
                raise ConfigError(f"starting must be {{'timestamp': epoch_ms}}, got {starting}")
        elif starting not in ("earliest", "latest"):
            raise ConfigError(f"starting must be earliest, latest or a timestamp: {starting!r}")
        if isolation_level not in ("read_committed", "read_uncommitted"):
            raise ConfigError(f"unknown isolation_level {isolation_level!r}")
        if connect_timeout_s <= 0 or poll_timeout_ms < MIN_POLL_TIMEOUT_MS:
            raise ConfigError(
                f"connect_timeout_s must be > 0 and poll_timeout_ms >= {MIN_POLL_TIMEOUT_MS} "
                f"(a fetch that does not wait spins on an idle topic), got {connect_timeout_s} "
                f"and {poll_timeout_ms}"
            )
        if value_format is not None and deserializer is not orjson.loads:
            raise ConfigError("KafkaSource: give value_format or deserializer, not both")
        if key_format is not None and key_deserializer is not None:
            raise ConfigError("KafkaSource: give key_format or key_deserializer, not both")
        self.starting = starting
        self.isolation_level = isolation_level
        self.deserializer = deserializer
        self.key_deserializer = key_deserializer
        self.value_format = value_format
        self.key_format = key_format
        #: events are orjson.loads's fresh output: the default deserializer, no key pairs
        #: (a channel to another worker then skips its JSON check; see ``Source``)
        self.json_exact = (
            deserializer is orjson.loads
            and key_deserializer is None
            and value_format is None
            and key_format is None
        )
        self.required = dict(required or {})
        self.consumer_config = dict(consumer_config or {})
        self.commit_offsets_to_kafka = commit_offsets_to_kafka
        self.group_id = group_id
        #: commit checkpointed offsets to the group: asked for, or implied by a group id
        self.commits_offsets = (
            commit_offsets_to_kafka if commit_offsets_to_kafka is not None else group_id is not None
        )
        self.bounded = stop_at_end
        self.key_grouped = key_grouped
        self.poll_timeout_ms = poll_timeout_ms
        self.connect_timeout_s = connect_timeout_s
        self.name = name

    def create_reader(self, ctx: ConnectorContext) -> KafkaSourceReader:
        # here, not at the top: the reader needs aiokafka (~0.25 s of CPU to import),
        # which a process that only builds the job (the main one, job.workers > 1) never runs
        from aiostream_ckpt.connectors.kafka.reader import KafkaSourceReader

        return KafkaSourceReader(self, ctx)
