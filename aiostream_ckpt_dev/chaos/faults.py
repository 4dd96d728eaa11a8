"""Faults the chaos rounds inject between kill -9 restarts, beside the kills themselves.

- ``two_successors``: the restart after a kill is started twice at the same
  moment on the same directories (a supervisor and a person restarting by
  hand): exactly one may run, the other must exit 2 naming the owner's pid
  (the owner is held with SIGSTOP until then, so that the two overlap).
- ``corrupt_newest``: one byte of the newest completed checkpoint's keyed
  state file is flipped before a restart: the restart must fall back to an
  older checkpoint (retracting, i.e. moving aside, output committed after it),
  and the round's committed output must still prove exactly-once.

A clock skewed against the filesystem's is not among them: the engine takes
its clock only in-process (``JobRunner(clock=...)``, as the retention test
does), with no way to skew a worker process's clock.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from aiostream_ckpt.checkpoint.storage import CheckpointStorage, read_checkpoint
from aiostream_ckpt.runtime.failover.ownership import LOCK_FILE

TWO_SUCCESSORS = "two_successors"
CORRUPT_NEWEST = "corrupt_newest"
FAULTS = (TWO_SUCCESSORS, CORRUPT_NEWEST)

#: windows whose kill comes after a checkpoint of the run: the owner outlives its rival's start
_RIVAL_WINDOWS = ("snapshot_write", "metadata_durable", "sink_commit", "final_metadata_durable")
#: kill windows after which the newest checkpoint's output is usually committed already
_COMMITTED_WINDOWS = ("snapshot_write", "position")
#: what the run that restores a corrupted checkpoint logs
FALLBACK_MARK = "falling back to the previous one"
RETRACTED = re.compile(rb"retracted (\d+) committed record\(s\)")


def plan_faults(windows: Sequence[str]) -> dict[int, list[str]]:
    """Faults by run index of a round whose planned kills are at ``windows``.

    The corruption goes after the first kill past a committed checkpoint, so
    that falling back retracts output (else after run 0, killed once a
    checkpoint is durable, see ``plan_round``). Two successors start the first
    later run planned to be killed after its recovery and a checkpoint; a run
    killed during recovery, or one to the end (the owner may end before its
    rival even starts), would not show two at once: a round without such a
    run has no rival.
    """
    if not windows:
        return {}
    corrupt = next((i + 1 for i in range(1, len(windows)) if windows[i] in _COMMITTED_WINDOWS), 1)
    faults: dict[int, list[str]] = {corrupt: [CORRUPT_NEWEST]}
    rivals = [i for i in range(1, len(windows)) if windows[i] in _RIVAL_WINDOWS]
    if rivals:
        faults.setdefault(rivals[0], []).append(TWO_SUCCESSORS)
    return faults


def corrupt_newest(checkpoint_dir: Path) -> Path | None:
    """Flip a byte of the newest completed checkpoint's newest keyed state file.

    Returns the file, or None when no completed checkpoint has keyed state.
    """
    storage = CheckpointStorage(checkpoint_dir)
    for cid in storage.completed_newest_first():
        chk = read_checkpoint(storage.checkpoint_dir(cid))
        for op in chk.operators.values():
            for sub in op.get("subtasks", {}).values():
                chain = (sub.get("keyed") or {}).get("chain") or []
                if not chain:
                    continue
                victim = checkpoint_dir / str(chain[-1]["path"])
                data = bytearray(victim.read_bytes())
                data[len(data) // 2] ^= 0xFF
                victim.write_bytes(bytes(data))
                return victim
        return None
    return None


def hold_owner_until_refused(
    procs: Sequence[subprocess.Popen[bytes]], checkpoint_dir: Path, deadline: float
) -> int:
    """Return the index of the one of ``procs`` that locked ``checkpoint_dir`` (the owner).

    The owner is stopped (SIGSTOP) from the moment its owner line is in the
    lock file until the other has ended: started at the same moment, a
    rival's imports may take longer than the owner needs to reach its planned
    kill, and then the two would not overlap at all.
    """
    lock = checkpoint_dir / LOCK_FILE
    pids = [p.pid for p in procs]
    owner: int | None = None
    try:
        while True:
            if time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                    p.wait()
                raise TimeoutError("two successors: neither locked or was refused in time")
            if owner is None:
                try:
                    pid = orjson.loads(lock.read_bytes().splitlines()[0])["pid"]
                except (OSError, IndexError, KeyError, TypeError, orjson.JSONDecodeError):
                    pid = None  # not written yet, or a dead owner's line being replaced
                if pid in pids:
                    owner = pids.index(pid)
                    os.kill(pid, signal.SIGSTOP)
            codes = [p.poll() for p in procs]
            if owner is not None and codes[1 - owner] is not None:
                return owner
            if all(c is not None for c in codes):  # neither locked: both ended
                return 0
            time.sleep(0.002)
    finally:
        if owner is not None and procs[owner].poll() is None:
            os.kill(pids[owner], signal.SIGCONT)


def refusal_problem(
    refused: subprocess.Popen[bytes], stderr: str, owner: subprocess.Popen[bytes]
) -> str | None:
    """None when ``refused`` exited 2 with a last line naming ``owner`` as the directory's owner."""
    lines = stderr.strip().splitlines()
    last = lines[-1] if lines else ""
    if refused.returncode == 2 and "is in use by job" in last and f"(pid {owner.pid} " in last:
        return None
    return (
        f"two successors: the one not owning exited {refused.returncode} "
        f"without naming owner pid {owner.pid}: {last!r}"
    )
