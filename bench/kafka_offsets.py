"""The output topic's end offsets, sampled from outside every system alike.

The bench samples the output topic's end offsets (high watermark, summed
over its partitions, one ListOffsets request on a raw socket every 100 ms).
Every system writes one update per input event, so that sum is its progress
in events. The high watermark counts records of open transactions too, so it
moves as the records reach the broker, not in 1 s steps at commits. Ours
holds an exactly-once partition's batch open across writes until it holds
128 KiB (``encoder.SEND_AT_BYTES``, ~3 k pv_count updates, ~0.1 s of a
partition at the bench's rates) or the barrier: steps about this sampling
interval.
"""

from __future__ import annotations

import contextlib
import socket
import struct

from aiostream_ckpt_dev.kafka_wire import end_offsets

#: Seconds between two samples of the output topic's end offsets.
SAMPLE_EVERY_S = 0.1


class EndOffsetSampler:
    """Sum of a topic's end offsets, sampled into ``samples`` as (seconds since start, records).

    Called by :func:`bench.monitor.run_monitored` every 50 ms with the time
    since the worker started; asks the broker every :data:`SAMPLE_EVERY_S`.
    A sample that fails (broker busy, socket closed) is skipped.
    """

    def __init__(self, host: str, port: int, topic: str, partitions: int) -> None:
        self.addr = (host, port)
        self.topic = topic
        self.partitions = list(range(partitions))
        self.samples: list[tuple[float, float]] = [(0.0, 0.0)]
        #: (seconds since start, records of each partition): each worker's progress
        self.per_partition: list[tuple[float, tuple[float, ...]]] = [
            (0.0, (0.0,) * len(self.partitions))
        ]
        self._sock: socket.socket | None = None
        self._cid = 0
        self._last = -1.0

    def read(self) -> dict[int, int]:
        if self._sock is None:
            self._sock = socket.create_connection(self.addr, timeout=2.0)
        self._cid = (self._cid + 1) & 0x7FFFFFFF
        return end_offsets(self._sock, self.topic, self.partitions, self._cid)

    def __call__(self, now: float) -> None:
        if now - self._last >= SAMPLE_EVERY_S:
            self.sample_at(now)

    def sample_at(self, now: float) -> None:
        self._last = now
        try:
            got = self.read()
        except (OSError, struct.error):
            self.close()
            return
        last = self.per_partition[-1][1]
        parts = tuple(
            max(float(got.get(p, 0)), was) for p, was in zip(self.partitions, last, strict=True)
        )
        self.per_partition.append((now, parts))
        self.samples.append((now, max(sum(parts), self.samples[-1][1])))

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
