from __future__ import annotations

import io

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
