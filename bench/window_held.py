"""The tumbling-window operator's cost past its held bound, or across checkpoints.

``python -m bench.window_held --kind process --windows 10000 --per-window 100 --bound 2000``
drives one window operator as a task does with checkpoints off (a batch, then
``end_batch``; no barrier), every record of a key in one tumbling window, the
keys round robin in batches of ``--batch`` records; the watermark at the end
fires every window. With more windows open than ``--bound`` (the state cache's
``cache_max_entries``, hence ``max_held``) each batch's buffer is written to
keyed state after it: a record's cost past the bound must not grow with its
window's length. Prints CPU seconds (of this process), peak RSS, the working
LMDB's size and the output count: the operator alone, not the job around it.
``--barrier-every N`` takes a checkpoint every N batches (incremental, as
the task does) and adds the bytes all of them wrote. ``--slide N`` uses
sliding windows of the same size, N windows per record (1: the tumbling
windows' contents, on the general path, which any other assigner takes).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from aiostream_ckpt.jobspec.functions import RuntimeContext
from aiostream_ckpt.jobspec.graph import WindowKind, WindowSpec
from aiostream_ckpt.jobspec.window_functions import CountAggregate, ProcessWindowFunction
from aiostream_ckpt.runtime.windowing.window_operator import WindowOperator
from aiostream_ckpt.state.backend import SnapshotTarget
from aiostream_ckpt.time import SlidingEventTimeWindows, TumblingEventTimeWindows
from bench.backends import one_instance_backend


class CountElements(ProcessWindowFunction[Any, Any, Any]):
    def process(self, key: Any, context: Any, elements: Any, out: Any) -> None:
        out.collect((key, len(elements)))


def _checkpoint(op: WindowOperator, root: Path, cid: int) -> None:
    """A checkpoint as the task takes one: the pre-barrier flush, then the backend's parts."""
    op.prepare_snapshot_pre_barrier(cid)
    backend = op.backend
    assert backend is not None
    part = backend.snapshot(SnapshotTarget(cid, root, root / f"chk-{cid}", root / "shared"))
    asyncio.run(part.prepare())
    part.write()
    asyncio.run(part.settle())
    backend.notify_checkpoint_complete(cid)


def run(
    kind: str,
    windows: int,
    per_window: int,
    bound: int,
    batch: int,
    barrier_every: int = 0,
    slide: int = 0,
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="window-held-"))
    root = tmp / "checkpoints"
    backend = one_instance_backend("w", tmp / "local", cache_max_entries=bound)
    process = kind == "process"
    size = 1 << 40
    spec = WindowSpec(
        assigner=SlidingEventTimeWindows.of(size, size // slide)
        if slide
        else TumblingEventTimeWindows.of(size),
        kind=WindowKind.PROCESS if process else WindowKind.AGGREGATE,
        timestamp_assigner=lambda e: e["ts"],
        function=CountElements() if process else CountAggregate(),
    )
    op = WindowOperator("w", spec, lambda e: e["k"])
    op.backend = backend
    ctx = RuntimeContext(
        operator_uid="w", subtask_index=0, parallelism=1, params={}, backend=backend
    )
    op.open(ctx)
    # built batch by batch: the records' own memory stays out of the peak RSS
    events = ({"k": k, "ts": r} for r in range(per_window) for k in range(windows))
    fired = 0
    t0 = time.process_time()
    batches = 0
    while records := list(itertools.islice(events, batch)):
        fired += len(op.process_batch(records))
        op.end_batch()
        batches += 1
        if barrier_every and batches % barrier_every == 0:
            _checkpoint(op, root, batches // barrier_every)
    fired += len(op.process_watermark(size - 1))
    op.end_batch()
    cpu = time.process_time() - t0
    working = backend.working_bytes()
    written = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    backend.close()
    shutil.rmtree(tmp)
    assert fired == windows * max(slide, 1), fired
    return {
        "cpu_s": round(cpu, 2),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "working_lmdb_mb": working >> 20,
        "checkpoint_mb": round(written / 2**20, 1),
        "max_held": op.max_held,
        "fired": fired,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=["process", "aggregate"], default="process")
    parser.add_argument("--windows", type=int, default=10_000)
    parser.add_argument("--per-window", type=int, default=100)
    parser.add_argument("--bound", type=int, default=2_000, help="state.cache_max_entries")
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument(
        "--barrier-every", type=int, default=0, help="a checkpoint every N batches (0: none)"
    )
    parser.add_argument(
        "--slide", type=int, default=0, help="sliding windows, N per record (0: tumbling)"
    )
    a = parser.parse_args()
    print(run(a.kind, a.windows, a.per_window, a.bound, a.batch, a.barrier_every, a.slide))


if __name__ == "__main__":
    main()
