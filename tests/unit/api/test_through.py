"""``Stream.through``: a repartition topic as a transactional sink and a key-grouped source."""

from __future__ import annotations

from operator import itemgetter

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.kafka.sink import KafkaSink
from aiostream_ckpt.connectors.kafka.source import KafkaSource
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.jobspec.graph import Partitioning, TransformKind
from aiostream_ckpt.runtime.graph import plan_chains


def test_through_writes_by_key_group_and_reads_keyed_without_a_shuffle() -> None:
    env = StreamEnvironment("j", config=JobConfig(parallelism=2, max_parallelism=64))
    events = env.from_collection([{"user": "u1"}], uid="events")
    keyed = events.through("by-user", "localhost:9092", itemgetter("user"), uid="rp")
    keyed.map(lambda e: e, uid="after").print()
    nodes = {t.uid: t for t in env.spec().transformations}
    write, read = nodes["rp-write"], nodes["rp-read"]
    assert write.kind is TransformKind.SINK and read.kind is TransformKind.SOURCE
    sink, source = write.fn, read.fn
    assert isinstance(sink, KafkaSink) and isinstance(source, KafkaSource)
    assert sink.semantic == "exactly_once" and sink.topic == "by-user"
    assert sink.partitioner is not None and sink.partitioner.max_parallelism == 64
    assert source.key_grouped and source.isolation_level == "read_committed"
    assert not source.bounded  # the repartition topic has no end
    assert nodes["after"].partitioning is Partitioning.FORWARD_KEYED
    # two pipelines in one job: the read side chained to what follows it
    chains = plan_chains(env.spec().transformations, env.config)
    assert ["rp-read", "after", "stdout"] in [[t.uid for t in c.nodes] for c in chains]
