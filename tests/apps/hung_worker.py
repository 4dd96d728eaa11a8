"""pv_count whose worker process hangs once (SIGSTOP): before its hello, in its restore, or running.

A worker that hangs importing the app, or in a user function's ``open()``
(connecting to something that never answers), is alive: its control
connection stays open, so only a timeout can end the main process's wait.

``app.hang``: ``hello`` (the worker stops itself while building the job),
``restore`` (in ``open()``, once ``app.after`` exists: a later attempt's
restore from a checkpoint) or ``run`` (counting the record of seq
``app.hang_at``: a running worker). ``app.marker``: created by the one process that
hangs (the next attempt's workers run on). ``app.fail_at`` / ``app.after``:
the counter raises once, at the first record from that seq on seen once a
checkpoint in ``app.ckpt`` (the job's ``checkpoint.dir``) is complete, and
creates ``after``: the failure that makes the restore a restore from a
checkpoint, however slowly a loaded machine takes its first one. Main never
hangs: only a worker process (``python -m aiostream_ckpt.daemon.worker``) does.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink
from apps.pv_count import CountPageViews, app_id, event_source


def in_worker() -> bool:
    """Whether this is a worker process (``python -m aiostream_ckpt.daemon.worker``)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return spec is not None and spec.name == "aiostream_ckpt.daemon.worker"


def first_worker(marker: str) -> bool:
    """Whether this is a worker process, and the first of all to ask (it creates ``marker``)."""
    return in_worker() and once(marker)


def once(marker: str) -> bool:
    """Whether this process is the first to ask (it creates ``marker``)."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def checkpointed(ckpt: str) -> bool:
    """Whether a checkpoint in ``ckpt`` is complete (its metadata is written last)."""
    return any(Path(ckpt).glob("chk-*/_metadata"))


def hang_once(marker: str) -> None:
    """SIGSTOP this worker process unless another process already hung (the marker exists)."""
    if not first_worker(marker):
        return
    print(f"hung_worker: pid {os.getpid()} stops itself", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)


class HangingCount(CountPageViews):
    def __init__(
        self, hang: str, marker: str, fail_at: int, after: str, hang_at: int, ckpt: str
    ) -> None:
        self.hang, self.marker, self.fail_at, self.after = hang, marker, fail_at, after
        self.hang_at, self.ckpt = hang_at, ckpt

    def open(self, ctx):
        if self.hang == "restore" and Path(self.after).exists():
            hang_once(self.marker)
        super().open(ctx)

    def process_element(self, value, ctx, out):
        if self.hang == "run" and value.get("seq") == self.hang_at:
            hang_once(self.marker)
        seq = value.get("seq", -1)
        if 0 <= self.fail_at <= seq and not Path(self.after).exists() and self._may_fail():
            raise RuntimeError(f"injected failure at seq {seq}")
        super().process_element(value, ctx, out)

    def _may_fail(self) -> bool:
        """Whether to fail now: a checkpoint is complete and no other subtask failed first."""
        return checkpointed(self.ckpt) and once(self.after)


def build(env: StreamEnvironment) -> None:
    p = env.params
    hang, marker = str(p["hang"]), str(p["marker"])
    if hang == "hello":
        hang_once(marker)
    fail_at, hang_at = int(p.get("fail_at", -1)), int(p.get("hang_at", -1))
    after, ckpt = str(p.get("after", marker + ".f")), str(p.get("ckpt", ""))
    fn = HangingCount(hang, marker, fail_at, after, hang_at, ckpt)
    events = env.from_source(event_source(p), uid="events")
    events.key_by(app_id).process(fn, uid="pv-count").sink_to(
        ExactlyOnceFileSink(str(p["output"])), uid="pv-sink"
    )
