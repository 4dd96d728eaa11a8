"""The history entry of each ended checkpoint: what the REST API's checkpoint list shows.

The coordinator hands each entry to ``on_history`` and keeps none; the job's
stats (``daemon/metrics.py``) keep the recent ones.
"""

from __future__ import annotations

from typing import Any

from aiostream_ckpt.checkpoint.metadata import AbortReason, CompletedCheckpoint, PendingCheckpoint


def completed_entry(completed: CompletedCheckpoint) -> dict[str, Any]:
    """Return the entry of a completed checkpoint: its duration, size, slowest task's phases.

    And how it was taken (:func:`alignment`): aligned or unaligned, the longest
    alignment, the in-flight records its channel state holds.
    """
    tasks = completed.tasks.values()
    return {
        "id": completed.checkpoint_id,
        "status": "completed",
        "savepoint": completed.is_savepoint,
        "trigger_time": completed.trigger_time,
        "duration_ms": completed.duration_seconds * 1000,
        "size_bytes": completed.size_bytes,
        "sync_ms_max": max((t["sync_ms"] for t in tasks), default=0.0),
        "async_ms_max": max((t["async_ms"] for t in tasks), default=0.0),
        **alignment(completed),
    }


def alignment(completed: CompletedCheckpoint) -> dict[str, Any]:
    """Return whether ``completed`` was taken unaligned anywhere, and what it persisted in flight.

    ``unaligned``: some task took it unaligned (``checkpoint.unaligned``; with
    ``checkpoint.aligned_timeout`` only the tasks where it waited too long);
    ``alignment_ms_max``: the longest a task waited for its barriers;
    ``in_flight_records`` / ``in_flight_bytes``: its channel state, over the tasks.
    """
    tasks = completed.tasks.values()
    return {
        "unaligned": any(t.get("unaligned", False) for t in tasks),
        "alignment_ms_max": max((t["alignment_ms"] for t in tasks), default=0.0),
        "in_flight_records": sum(int(t.get("in_flight_records", 0)) for t in tasks),
        "in_flight_bytes": sum(int(t.get("in_flight_bytes", 0)) for t in tasks),
    }


def aborted_entry(pending: PendingCheckpoint, reason: AbortReason, detail: str) -> dict[str, Any]:
    """Return the entry of an aborted checkpoint: why it ended."""
    return {
        "id": pending.checkpoint_id,
        "status": "aborted",
        "savepoint": pending.is_savepoint,
        "trigger_time": pending.trigger_wall_time,
        "reason": reason.value,
        "detail": detail,
    }
