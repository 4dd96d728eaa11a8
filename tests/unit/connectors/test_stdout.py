from __future__ import annotations

import io
from typing import Any

import pytest

from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.stdout import StdoutSink


async def test_stdout_sink_prints_json_lines() -> None:
    buf = io.BytesIO()
    w = StdoutSink(stream=buf).create_writer(ConnectorContext("job", "out", 0, 1))
    await w.recover(None, None)
    await w.write([{"a": 1}, [2]])
    await w.write([])
    assert await w.prepare_commit(1) == {}
    await w.commit(1)
    await w.close()
    assert buf.getvalue() == b'{"a":1}\n[2]\n'


async def test_records_the_serializer_fails_on_go_to_record_failed_and_are_left_out() -> None:
    """orjson cannot write a set: that record alone is handed over (dead-lettered), whole."""
    buf = io.BytesIO()
    w = StdoutSink(stream=buf).create_writer(ConnectorContext("job", "out", 0, 1))
    failed: list[tuple[str, Any, str]] = []
    w.record_failed = lambda fn, rec, exc: failed.append((fn, rec, type(exc).__name__))
    await w.recover(None, None)
    await w.write([{"a": 1}, {"b": {2}}, [3]])
    await w.write([{"c": {4}}])  # nothing left to print
    assert buf.getvalue() == b'{"a":1}\n[3]\n'
    assert failed == [
        ("serializer dumps", {"b": {2}}, "TypeError"),
        ("serializer dumps", {"c": {4}}, "TypeError"),
    ]
    # unbound (no task): the serializer's error as it was
    plain = StdoutSink(stream=io.BytesIO()).create_writer(ConnectorContext("job", "out", 0, 1))
    with pytest.raises(TypeError):
        await plain.write([{"d": {5}}])
