"""CPU of pv_count on key-grouped files: ``reinterpret_as_keyed`` against ``key_by``.

``python -m bench.key_grouped [--events N] [--keys K] [--parallelism P] [--runs R]
[--in-process] [--components]`` writes N generated events once as P key-grouped
files (``write_key_grouped``), then runs ``aiostream-ckpt run apps.pv_count`` on
those same files R times in each mode, in pairs whose order alternates:
``app.key_grouped=1`` (the count chained to the source, no shuffle) and ``0``
(``key_by``: a partitioner and a channel between tasks).
It prints the user+sys CPU seconds of each run (the run's process, from
``wait4``) and the medians: CPU, not wall time, so a loaded machine skews it
less. Checkpoints every second, as the demo does. ``--in-process`` runs the
jobs in this process instead (``env.execute()``, ``getrusage`` around it):
no interpreter start in the figure, so the per-record difference shows
with less noise. ``--components`` times only the parts that differ, on
the same batches: the shuffle's ``KeyGroupGate.emit`` (to channels that take
batches for free) against the arrival check ``KeyGroupCheck.process_batch``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.generator import write_generated_jsonl
from aiostream_ckpt.connectors.key_grouped import write_key_grouped
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.runtime.key_group_check import KeyGroupCheck
from aiostream_ckpt.runtime.partitioners import KeyGroupGate
from apps import pv_count
from apps.pv_count import app_id


def _run(files: list[Path], work: Path, key_grouped: bool, parallelism: int) -> float:
    """CPU seconds (user+sys) of one run to the end; fresh checkpoint and output dirs."""
    tag = f"{'kg' if key_grouped else 'hash'}-{len(list(work.glob('*-ckpt')))}"
    sets = {
        "app.input": ",".join(map(str, files)),
        "app.output": str(work / f"{tag}-out"),
        "app.key_grouped": "1" if key_grouped else "0",
        "checkpoint.dir": str(work / f"{tag}-ckpt"),
        "job.parallelism": str(parallelism),
        "rest.enabled": "false",
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    cmd = [sys.executable, "-m", "aiostream_ckpt.daemon.cli", "run", "apps.pv_count", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {err[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def _run_in_process(files: list[Path], work: Path, key_grouped: bool, parallelism: int) -> float:
    """CPU seconds (user+sys, all threads) of one ``env.execute()`` of pv_count here."""
    tag = f"{'kg' if key_grouped else 'hash'}-{len(list(work.glob('*-ckpt')))}"
    config = JobConfig(parallelism=parallelism).with_checkpoint_dir(work / f"{tag}-ckpt")
    params = {
        "input": ",".join(map(str, files)),
        "output": str(work / f"{tag}-out"),
        "key_grouped": "1" if key_grouped else "0",
    }
    env = StreamEnvironment("pv_count", config=config, params=params)
    pv_count.build(env)
    before = resource.getrusage(resource.RUSAGE_SELF)
    env.execute()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


class _FreeChannel:
    """A channel whose ``send`` costs nothing but the await: the gate's own work shows."""

    async def send(self, element: object) -> None:
        return None


def _components(events: int, keys: int, parallelism: int, runs: int) -> None:
    batch = [{"app_id": f"app-{i % keys}", "seq": i} for i in range(2048)]
    n = max(1, events // len(batch))
    gate = KeyGroupGate([_FreeChannel() for _ in range(parallelism)], app_id, 128)  # type: ignore[list-item]
    # what subtask 0 sees of key-grouped input: only its own keys
    check = KeyGroupCheck(
        "pv",
        app_id,
        subtask=0,
        parallelism=parallelism,
        max_parallelism=128,
        describe_input=lambda: "bench",
    )
    own = [r for r in batch if gate.route(app_id(r)) == 0]
    own = (own * (len(batch) // len(own) + 1))[: len(batch)]

    async def shuffle() -> None:
        for _ in range(n):
            await gate.emit(batch)

    def arrival_check() -> None:
        for _ in range(n):
            check.process_batch(own)

    for name, fn in (
        ("KeyGroupGate.emit", lambda: asyncio.run(shuffle())),
        ("KeyGroupCheck", arrival_check),
    ):
        times = []
        for _ in range(runs):
            t = time.process_time()
            fn()
            times.append(time.process_time() - t)
        med = statistics.median(times)
        print(
            f"{name:>18}: {med * 1e9 / (n * len(batch)):.0f} ns CPU per record (median of {runs})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--in-process", action="store_true")
    ap.add_argument("--components", action="store_true")
    a = ap.parse_args()
    if a.components:
        _components(a.events, a.keys, a.parallelism, a.runs)
        return
    run = _run_in_process if a.in_process else _run
    with tempfile.TemporaryDirectory(prefix="bench-key-grouped-") as tmp:
        work = Path(tmp)
        raw = work / "raw.jsonl"
        write_generated_jsonl(raw, a.events, keys=a.keys)
        with open(raw, "rb") as f:
            records = (orjson.loads(line) for line in f)
            files = write_key_grouped(records, app_id, work / "in", parts=a.parallelism)
        raw.unlink()
        cpu: dict[str, list[float]] = {"reinterpret_as_keyed": [], "key_by": []}
        for i in range(a.runs):
            # alternate which goes first: a run pays for what the one before left
            # (garbage, freed memory, page cache), and in one process that drifts
            for key_grouped in (True, False) if i % 2 == 0 else (False, True):
                mode = "reinterpret_as_keyed" if key_grouped else "key_by"
                cpu[mode].append(run(files, work, key_grouped, a.parallelism))
        for mode, runs in cpu.items():
            med = statistics.median(runs)
            print(
                f"{mode:>22}: CPU s (user+sys) {' '.join(f'{x:.2f}' for x in runs)}; "
                f"median {med:.2f} = {med * 1e6 / a.events:.2f} s per million events"
            )
        ratio = statistics.median(cpu["key_by"]) / statistics.median(cpu["reinterpret_as_keyed"])
        print(f"key_by / reinterpret_as_keyed CPU: {ratio:.2f}x ({os.getloadavg()[0]:.1f} load)")


if __name__ == "__main__":
    main()
