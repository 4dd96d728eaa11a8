"""A fresh stand-in schema registry per test (a loopback HTTP thread; milliseconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aiostream_ckpt_dev.schema_registry import SchemaRegistryStandIn


@pytest.fixture
def stand_in() -> Iterator[SchemaRegistryStandIn]:
    with SchemaRegistryStandIn() as server:
        yield server
