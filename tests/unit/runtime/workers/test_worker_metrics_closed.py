"""A worker's figures after an ack, when the main process has already closed the connection.

At a failover the main process says stop and closes the control connection
while a worker's tasks still ack: the report due after that ack has nobody
to go to. It must be dropped quietly, not end as an "Exception in callback"
traceback in the job's log at every restart.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from aiostream_ckpt.clock import ManualClock
from aiostream_ckpt.runtime.network.remote import ChannelConnection
from aiostream_ckpt.runtime.wire import batch_codec
from aiostream_ckpt.runtime.workers.worker_metrics import MetricsReporter


async def test_a_report_due_after_main_closed_is_dropped_quietly() -> None:
    main_sock, worker_sock = socket.socketpair()
    main = ChannelConnection("main", batch_codec())
    control = ChannelConnection("worker-1-control", batch_codec())
    await main.start(main_sock)
    await control.start(worker_sock)
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        reporter = MetricsReporter(control, 1, [], ManualClock().monotonic)
        await main.close()  # goodbye: the stop of a failover
        await control.wait_closed()

        reporter.report_soon()  # an ack of a task still running
        await asyncio.sleep(0)
        await asyncio.sleep(0)

        assert errors == []
    finally:
        loop.set_exception_handler(None)
        await control.close()
