"""pv_count whose worker forks a child that outlives it (as a ``multiprocessing`` pool would).

The forked child inherits every descriptor, so it holds the worker's control
connection and its sockets to the other workers open. Once, in one worker's
``open()`` (``app.marker`` records it), the child kills its parent worker
after ``app.kill_after`` seconds with SIGKILL, then lingers as long as the
main process lives: the worker's death gives no end of file anywhere.
"""

from __future__ import annotations

import os
import signal
import time

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink
from apps.pv_count import CountPageViews, app_id, event_source
from tests.apps.hung_worker import first_worker


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie its parent has not reaped yet does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def fork_a_killer(marker: str, kill_after: float) -> None:
    """Fork the child that kills this worker and keeps its sockets open (once, in a worker)."""
    if not first_worker(marker):
        return
    worker, main = os.getpid(), os.getppid()
    if os.fork() != 0:
        return
    try:  # the child: only sleeps and signals (safe after a fork of a threaded process)
        time.sleep(kill_after)
        os.write(2, f"forking_worker: killing worker pid {worker}\n".encode())
        os.kill(worker, signal.SIGKILL)
        for fd in (0, 1, 2):  # the sockets stay open, not the run's output pipes
            os.close(fd)
        deadline = time.monotonic() + 120
        while _alive(main) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        os._exit(0)


class ForkingCount(CountPageViews):
    def __init__(self, marker: str, kill_after: float) -> None:
        self.marker, self.kill_after = marker, kill_after

    def open(self, ctx):
        fork_a_killer(self.marker, self.kill_after)
        super().open(ctx)


def build(env: StreamEnvironment) -> None:
    p = env.params
    fn = ForkingCount(str(p["marker"]), float(p.get("kill_after", 0.5)))
    events = env.from_source(event_source(p), uid="events")
    events.key_by(app_id).process(fn, uid="pv-count").sink_to(
        ExactlyOnceFileSink(str(p["output"])), uid="pv-sink"
    )
