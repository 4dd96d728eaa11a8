"""A KafkaSource declares its events exact for JSON only with the default deserializer."""

import orjson

from aiostream_ckpt.connectors.kafka.source import KafkaSource


def test_only_orjson_loads_events_are_declared_exact() -> None:
    assert KafkaSource("t", "127.0.0.1:9092").json_exact is True
    # (key, value) pairs are tuples; another deserializer may build anything
    assert KafkaSource("t", "127.0.0.1:9092", key_deserializer=bytes.decode).json_exact is False
    assert (
        KafkaSource("t", "127.0.0.1:9092", deserializer=lambda b: orjson.loads(b)).json_exact
        is False
    )
