"""CPU of pv_count on key-grouped files: ``reinterpret_as_keyed`` against ``key_by``.

``python -m bench.key_grouped [--events N] [--keys K] [--parallelism P] [--runs R]``
writes N generated events once as P key-grouped files (``write_key_grouped``),
then runs ``aiostream-ckpt run apps.pv_count`` on those same files R times in
each mode, alternating: ``app.key_grouped=1`` (the count chained to the source,
no shuffle) and ``0`` (``key_by``: a partitioner and a channel between tasks).
It prints the user+sys CPU seconds of each run (the run's process, from
``wait4``) and the medians: CPU, not wall time, so a loaded machine skews it
less. Checkpoints every second, as the demo does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

from aiostream_ckpt.connectors.generator import write_generated_jsonl
from aiostream_ckpt.connectors.key_grouped import write_key_grouped
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-key-grouped-") as tmp:
        work = Path(tmp)
        raw = work / "raw.jsonl"
        write_generated_jsonl(raw, a.events, keys=a.keys)
        with open(raw, "rb") as f:
            records = (orjson.loads(line) for line in f)
            files = write_key_grouped(records, app_id, work / "in", parts=a.parallelism)
        raw.unlink()
        cpu: dict[str, list[float]] = {"reinterpret_as_keyed": [], "key_by": []}
        for _ in range(a.runs):
            cpu["reinterpret_as_keyed"].append(_run(files, work, True, a.parallelism))
            cpu["key_by"].append(_run(files, work, False, a.parallelism))
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
