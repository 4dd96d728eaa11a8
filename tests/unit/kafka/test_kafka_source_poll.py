"""A KafkaSource whose fetch would not wait is refused: on an idle topic it spins a core.

aiokafka's ``getmany(timeout_ms=0)`` returns at once when nothing is buffered,
so a reader polling with 0 ms read again and again on an empty topic, and one
without partitions slept 0 s between looks.
"""

import pytest

from aiostream_ckpt.connectors.kafka.source import MIN_POLL_TIMEOUT_MS, KafkaSource
from aiostream_ckpt.errors import ConfigError


@pytest.mark.parametrize("poll_timeout_ms", [0, 1, MIN_POLL_TIMEOUT_MS - 1])
def test_a_fetch_that_does_not_wait_is_refused(poll_timeout_ms: int) -> None:
    with pytest.raises(ConfigError, match=f"poll_timeout_ms >= {MIN_POLL_TIMEOUT_MS}"):
        KafkaSource("t", "127.0.0.1:9092", poll_timeout_ms=poll_timeout_ms)


def test_the_default_and_the_shortest_wait_are_taken() -> None:
    assert KafkaSource("t", "127.0.0.1:9092").poll_timeout_ms == 100
    assert KafkaSource("t", "127.0.0.1:9092", poll_timeout_ms=10).poll_timeout_ms == 10
