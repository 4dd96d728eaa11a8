"""A stand-in Confluent Schema Registry (in memory, loopback): see :mod:`.server` for why."""

from aiostream_ckpt_dev.schema_registry.server import SchemaRegistryStandIn

__all__ = ["SchemaRegistryStandIn"]
