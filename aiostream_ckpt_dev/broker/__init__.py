"""A real single-node Kafka broker for tests, demos and the bench (``aiostream-ckpt broker``)."""

from aiostream_ckpt_dev.broker.process import KafkaBroker

__all__ = ["KafkaBroker"]
