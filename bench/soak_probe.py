"""Run the CLI with an in-process memory probe: does anything grow with checkpoints?

``python -m bench.soak_probe OUT.jsonl [--every S] -- run apps.pv_count --set ...``

A thread samples every ``--every`` seconds, as a JSON line: VmRSS and RssAnon,
pymalloc's allocated blocks (``sys.getallocatedblocks``), glibc's ``mallinfo2``
(heap arena, mmapped chunks, bytes in use), the objects gc tracks (after
``gc.freeze``: those made since; their top types every 10th sample) and the
coordinator's next checkpoint id. A structure that grows with checkpoints
shows as a rising floor of blocks and bytes in use against the checkpoint id;
an RSS step over a flat floor is a high-water mark of transient memory (a
catch-up burst) that the allocators keep resident. Why a probe and not
tracemalloc: tracemalloc slows the snapshot thread so much (one checkpoint per
1.5 s instead of 8 per s) that it never reaches the checkpoint counts to
compare. See bench/README.md, "Soak RSS steps".
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import json
import sys
import threading
import time
from typing import Any, TextIO

_MALLINFO = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks")
_MALLINFO += ("uordblks", "fordblks", "keepcost")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO]


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "Threads"):
                out[key] = int(value.split()[0])
    return out


class Probe:
    """Samples the process it runs in (a daemon thread) into ``out``."""

    def __init__(self, out: TextIO, every: float) -> None:
        self._out = out
        self._every = every
        self._t0 = time.monotonic()
        self._coordinator: Any = None
        libc = ctypes.CDLL(None)
        self._mallinfo = getattr(libc, "mallinfo2", None)  # glibc >= 2.33
        if self._mallinfo is not None:
            self._mallinfo.restype = _MallInfo2

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True, name="soak-probe").start()

    def _run(self) -> None:
        for i in range(sys.maxsize):
            time.sleep(self._every)
            self._out.write(json.dumps(self.sample(i)) + "\n")

    def sample(self, i: int) -> dict[str, Any]:
        rec: dict[str, Any] = {"t": round(time.monotonic() - self._t0, 2), **_status()}
        rec["blocks"] = sys.getallocatedblocks()
        if self._mallinfo is not None:
            info = self._mallinfo()
            rec.update({k: getattr(info, k) for k in ("arena", "hblkhd", "uordblks", "fordblks")})
        if self._coordinator is None or i % 10 == 0:
            objects = gc.get_objects()
            if i % 10 == 0:
                types = collections.Counter(type(o).__name__ for o in objects)
                rec["objects"] = sum(types.values())
                rec["types"] = types.most_common(10)
            for o in objects:
                if type(o).__name__ == "CheckpointCoordinator":
                    self._coordinator = o
            del objects
        rec["next_checkpoint"] = getattr(self._coordinator, "_next_id", None)
        return rec


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, cli = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak_probe", usage="%(prog)s OUT [--every S] -- CLI ARGS..."
    )
    parser.add_argument("out", help="JSON-lines file of the samples")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between samples")
    args = parser.parse_args(own)
    with open(args.out, "w", buffering=1) as out:
        Probe(out, args.every).start()
        from aiostream_ckpt.daemon.cli import main as cli_main

        return cli_main(cli)


if __name__ == "__main__":
    sys.exit(main())
