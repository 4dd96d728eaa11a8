"""Named fault points: SIGKILL this process at an exact window of the checkpoint protocol.

Kill -9 by time or input position rarely lands in the narrow windows where
exactly-once is decided (a snapshot half written, metadata durable but sinks
not committed, a recovery half done). As TiKV's and FoundationDB's fail
points do, the engine names those windows and a test arms them::

    AIOSTREAM_FAILPOINTS="metadata_durable=kill@3;restore_before_sinks=kill"

kills the process the 3rd time a checkpoint's metadata is durable, or the
first time a task is about to recover its sinks. The CLI's ``run`` arms the
points from that variable (:func:`arm_from_env`), and so do the worker
processes of its first attempt (``job.workers`` > 1: the windows of tasks are
hit there, those of the coordinator in the main process); nothing else does,
so an embedded run (the proof's reference run) never dies of it, nor does a
restarted attempt die again of the same point.

Cost when disarmed: :func:`hit` is one truth test of a module-level dict. It
is called only on checkpoint and recovery paths, never per record.
"""

from __future__ import annotations

import os
import signal
import threading

from aiostream_ckpt.errors import ConfigError

ENV_VAR = "AIOSTREAM_FAILPOINTS"

#: Every point, with the window it stands for. Keep these few and documented.
POINTS: dict[str, str] = {
    "pre_barrier_flush": "a task's operators wrote what they hold (buffered windows, held "
    "sessions) into keyed state for a barrier; the snapshot has not started",
    "snapshot_write": "a task's asynchronous state snapshot file is written but not yet fsynced",
    "channel_state_write": "an unaligned checkpoint's in-flight records are written to its "
    "channel state file, not yet fsynced (the task has not acknowledged)",
    "checkpoint_uploaded": "checkpoint.dir=s3://: a checkpoint's state files and metadata "
    "are in the object store; the chain write that completes it has not been made",
    "metadata_durable": "a checkpoint's metadata is durable; no task has been notified "
    "(sinks have not committed)",
    "sink_commit": "a sink committed one more pre-committed file (or Kafka transaction); "
    "others of the same checkpoint may still be staged",
    "delta_files_written": "a Delta sink's subtask wrote and named its data files for a "
    "barrier (in no commit yet); the checkpoint is not acknowledged",
    "delta_commit": "a checkpoint's metadata is durable and its Delta data files are written; "
    "the Delta commit adding them has not been made",
    "delta_committed": "the Delta commit of a checkpoint is made; no task has been notified "
    "(the writers still list its files)",
    "restore_begin": "a task began restoring from a checkpoint (sources not yet rewound)",
    "restore_before_sinks": "a task restored its state; its sink has not yet recovered "
    "(committed/aborted the restored transactions)",
    "channel_state_replay": "a task restored from an unaligned checkpoint has replayed half "
    "of its in-flight records; no new input has been read",
    "restore_after_sinks": "a task's sink recovered; processing has not resumed",
    "final_metadata_durable": "end of input: the final checkpoint's metadata is durable, "
    "its output not yet committed",
    "final_committed": "end of input: a task committed the final checkpoint's output; "
    "the job has not exited",
    # the path of a triggered savepoint (``savepoint trigger``), hit only there
    "savepoint_triggered": "a savepoint's id is durable and its barriers are on their way; "
    "no task has snapshotted it",
    "savepoint_snapshot": "a task pre-committed its sink for a savepoint and the savepoint "
    "holds its copy of that output; the task has not acknowledged",
    "savepoint_metadata_durable": "a savepoint's metadata is durable; its caller has not "
    "been answered",
    "savepoint_answered": "the caller of POST /savepoints has its answer (the savepoint's id)",
    "savepoint_output_commit": "a checkpoint after a savepoint completed and a sink "
    "committed the savepoint's own pre-committed file (or Kafka transaction); the savepoint "
    "itself may still be completing",
    "savepoint_next_metadata_durable": "the first checkpoint after a savepoint is durable; "
    "no sink has committed the savepoint's output",
}

#: The points on a triggered savepoint's path, in the order it passes them.
SAVEPOINT_POINTS = (
    "savepoint_triggered",
    "savepoint_snapshot",
    "savepoint_metadata_durable",
    "savepoint_answered",
    "savepoint_next_metadata_durable",
    "savepoint_output_commit",
)

_armed: dict[str, int] = {}  # point -> the hit that kills
_hits: dict[str, int] = {}
_lock = threading.Lock()


def parse(spec: str) -> dict[str, int]:
    """``"a=kill@3;b=kill"`` -> ``{"a": 3, "b": 1}``; raises ConfigError naming the bad part.

    >>> parse("metadata_durable=kill@3; sink_commit=kill")
    {'metadata_durable': 3, 'sink_commit': 1}
    """
    armed: dict[str, int] = {}
    for part in (p.strip() for p in spec.replace(",", ";").split(";")):
        if not part:
            continue
        name, _, action = part.partition("=")
        name, action = name.strip(), action.strip()
        if name not in POINTS:
            raise ConfigError(
                f"{ENV_VAR}: unknown fail point {name!r} in {part!r}; known: {', '.join(POINTS)}"
            )
        verb, _, nth = action.partition("@")
        if verb != "kill" or (nth and not nth.isdigit()) or (nth and int(nth) < 1):
            raise ConfigError(f"{ENV_VAR}: {part!r}: the action is 'kill' or 'kill@N' (N >= 1)")
        armed[name] = int(nth) if nth else 1
    return armed


def arm(points: dict[str, int]) -> None:
    """Arm ``points`` (name -> which hit kills), replacing what was armed; hit counts restart."""
    with _lock:
        _armed.clear()
        _hits.clear()
        _armed.update(points)


def arm_from_env(environ: dict[str, str] | None = None) -> None:
    """Arm what ``AIOSTREAM_FAILPOINTS`` says (nothing when unset or empty)."""
    spec = (os.environ if environ is None else environ).get(ENV_VAR, "")
    arm(parse(spec))


def disarm() -> None:
    arm({})


def hit(name: str) -> None:
    """Pass the point ``name``; SIGKILL the process if this is the armed hit."""
    if _armed:
        _hit(name)


def _hit(name: str) -> None:
    with _lock:
        nth = _armed.get(name)
        if nth is None:
            return
        n = _hits[name] = _hits.get(name, 0) + 1
    if n == nth:
        # one unbuffered write, so the harness can tell which window the kill hit
        os.write(2, f"failpoint {name}: SIGKILL at hit {n}\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)
