"""The session window operator alone, its CPU split by phase: records, timers, flush, snapshot.

``python -m bench.session_phases --events 500000 --barrier-every 150000``
drives one session window operator (30 s gap, a count per session, the
bench's sessions row without the job around it) as a task does: a batch of
``--batch`` clicks, its end, a watermark 1 s behind the newest click; every
``--barrier-every`` events the pre-barrier flush and an incremental snapshot.
Clicks are one per ms over ``--users`` users (seeded), as in pv_count's input.
Prints the CPU seconds of each phase and the sessions fired. Why: the job's
figures mix the source, the sink and checkpoint I/O; this isolates the
operator's share, for A/B runs of a change (run two trees at once and compare
paired ratios: this machine's speed drifts by tens of % between minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import tempfile
import time
from operator import itemgetter
from pathlib import Path
from typing import Any

from aiostream_ckpt.jobspec.functions import RuntimeContext
from aiostream_ckpt.jobspec.graph import WindowKind, WindowSpec
from aiostream_ckpt.jobspec.window_functions import CountAggregate
from aiostream_ckpt.runtime.process import tune_gc
from aiostream_ckpt.runtime.windowing.session_windows import SessionWindowOperator
from aiostream_ckpt.state.backend import SnapshotTarget
from aiostream_ckpt.time import EventTimeSessionWindows
from bench.backends import one_instance_backend

GAP_MS = 30_000
MAX_DELAY_MS = 1_000


def clicks(n: int, users: int, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    t0 = 1_700_000_000_000
    return [{"user_id": f"user-{rng.randrange(users)}", "ts": t0 + i} for i in range(n)]


def run(
    events: list[dict[str, Any]], *, batch: int, barrier_every: int, work: Path
) -> dict[str, Any]:
    backend = one_instance_backend("sessions", work / "state")
    spec = WindowSpec(
        assigner=EventTimeSessionWindows.with_gap(GAP_MS),
        kind=WindowKind.AGGREGATE,
        timestamp_assigner=itemgetter("ts"),
        function=CountAggregate(),
    )
    op = SessionWindowOperator("sessions", spec, itemgetter("user_id"))
    op.backend = backend
    op.open(
        RuntimeContext(
            operator_uid="sessions", subtask_index=0, parallelism=1, params={}, backend=backend
        )
    )
    cpu = dict.fromkeys(("records", "timers", "flush", "snapshot"), 0.0)
    clock = time.process_time
    fired = since = checkpoints = 0
    newest = -(1 << 62)
    root = work / "checkpoints"
    for i in range(0, len(events), batch):
        part = events[i : i + batch]
        a = clock()
        fired += len(op.process_batch(part))
        op.end_batch()
        b = clock()
        newest = max(newest, max(e["ts"] for e in part))
        fired += len(op.process_watermark(newest - MAX_DELAY_MS - 1))
        op.end_batch()
        c = clock()
        cpu["records"] += b - a
        cpu["timers"] += c - b
        since += len(part)
        if since >= barrier_every:
            since, checkpoints = 0, checkpoints + 1
            op.prepare_snapshot_pre_barrier(checkpoints)
            d = clock()
            snap = backend.snapshot(
                SnapshotTarget(checkpoints, root, root / f"chk-{checkpoints}", root / "shared")
            )
            asyncio.run(snap.prepare())
            snap.write()
            asyncio.run(snap.settle())
            cpu["flush"] += d - c
            cpu["snapshot"] += clock() - d
    a = clock()
    fired += len(op.process_watermark(1 << 62))
    cpu["timers"] += clock() - a
    backend.close()
    return {
        **{k: round(v, 3) for k, v in cpu.items()},
        "total": round(sum(cpu.values()), 3),
        "fired": fired,
        "checkpoints": checkpoints,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.session_phases", description=__doc__)
    p.add_argument("--events", type=int, default=500_000)
    p.add_argument("--users", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--barrier-every", type=int, default=150_000)
    args = p.parse_args(argv)
    events = clicks(args.events, args.users)
    tune_gc(50_000)
    work = Path(tempfile.mkdtemp(prefix="session-phases-"))
    try:
        out = run(events, batch=args.batch, barrier_every=args.barrier_every, work=work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(" ".join(f"{k}={v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
