"""A topic the broker's metadata lacks is asked for again before it counts as missing."""

from __future__ import annotations

import pytest

from aiostream_ckpt.connectors.kafka.common import MISSING_TOPIC_WAITS, require_topics
from aiostream_ckpt.errors import ConnectorError


class _Cluster:
    def __init__(self, topics: dict[str, set[int]]) -> None:
        self._topics = topics

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self._topics.get(topic)


class _Client:
    """Serves the metadata snapshots given, then the last one again."""

    def __init__(self, *snapshots: dict[str, set[int]]) -> None:
        self._snapshots = list(snapshots)
        self.requests = 0

    async def fetch_all_metadata(self) -> _Cluster:
        self.requests += 1
        return _Cluster(self._snapshots.pop(0) if len(self._snapshots) > 1 else self._snapshots[0])


class _Clock:
    """Sleeps nothing, notes what was asked."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


async def test_a_topic_the_metadata_lists_a_moment_later_is_found() -> None:
    # CreateTopics answered; the broker's metadata lists the topic two requests later
    client, clock = _Client({}, {"a": set()}, {"a": {1, 0}, "b": {0}}), _Clock()
    got = await require_topics(client, ["a", "b"], bootstrap_servers="k:9092", clock=clock)
    assert got == {"a": [0, 1], "b": [0]}
    assert client.requests == 3 and clock.slept == list(MISSING_TOPIC_WAITS[:2])


async def test_a_topic_missing_from_every_request_is_refused_naming_it() -> None:
    client, clock = _Client({"a": {0}}), _Clock()
    with pytest.raises(ConnectorError, match="Kafka topic 'b' does not exist on k:9092") as info:
        await require_topics(client, ["a", "b"], bootstrap_servers="k:9092", clock=clock)
    assert not info.value.retriable
    assert client.requests == len(MISSING_TOPIC_WAITS) + 1
    assert clock.slept == list(MISSING_TOPIC_WAITS) and sum(clock.slept) < 2


async def test_topics_there_at_once_cost_one_request() -> None:
    client, clock = _Client({"a": {0, 2, 1}}), _Clock()
    got = await require_topics(client, ["a"], bootstrap_servers="k", clock=clock)
    assert got == {"a": [0, 1, 2]} and client.requests == 1 and not clock.slept
