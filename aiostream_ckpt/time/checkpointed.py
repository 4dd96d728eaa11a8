"""Event time in the checkpoint: each task's watermark and idleness survive a restore.

Why: lateness is decided against the watermark. A task restarted at the minimum
watermark takes records as on time (into windows) that a failure-free run sent
to the late output, so the committed output would depend on whether a failure
happened. Flink accepts that; we promise exactly-once output, so every task
puts its event time into the checkpoint and gets it back on restore.

What a task stores, as ``"time"`` in the state entry of every operator of its
chain that has one (source, keyed operators, sink)::

    {"watermark": int, "idle": bool,
     "splits": {split id: [max timestamp, idle, chunk records, chunk max]},  # source tasks
     "layout": [edge, ...], "channels": [[watermark, idle], ...]}   # tasks with inputs

Restore rule (:func:`merge`), the same for every part:

- unchanged parallelism: subtask ``i`` gets old subtask ``i``'s state, exactly;
- changed parallelism: the **minimum** watermark over every old subtask of the
  operator, idle only if all of them were. The new subtask may own key groups of
  any old one, and the minimum is the one watermark none of their records was
  late against: nothing a failure-free run kept is dropped; at worst a record
  late in that run is kept;
- source splits follow their split id (the union of the old subtasks'; a split
  several had, the ``"*"`` of readers without splits, gets the minimum);
- per-channel watermarks are restored only when the input layout (upstream
  operator, its parallelism and partitioning, per edge) is unchanged, element-wise
  minimum over the old subtasks; otherwise they start at the minimum and are
  filled by the upstream tasks' announcements.

After restoring, a task announces its watermark (and idleness) downstream
before its first record (``runtime.event_time.TaskEventTime.announce``), so
downstream channels need not wait for the upstream's next advance.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.jobspec.watermarks import MIN_WATERMARK

TIME_KEY = "time"


def restored_time(
    restored: CompletedCheckpoint | None,
    uids: Iterable[str | None],
    *,
    subtask: int,
    parallelism: int,
) -> dict[str, Any] | None:
    """Return the event time a task resumes from: the first of ``uids`` that stored one."""
    if restored is None:
        return None
    for uid in uids:
        if uid is None:
            continue
        olds = restored.subtask_states(uid)
        times = {sub: st[TIME_KEY] for sub, st in olds.items() if st.get(TIME_KEY)}
        if not times:
            continue
        old_p = int(restored.operators[uid].get("parallelism", -1))
        if old_p == parallelism and subtask in times:
            return dict(times[subtask])
        return merge([times[s] for s in sorted(times)])
    return None


def merge(olds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Combine old subtasks' event time for a rescaled subtask (see the module docstring).

    >>> merge([{"watermark": 5, "idle": True}, {"watermark": 3, "idle": False}])
    {'watermark': 3, 'idle': False}
    >>> merge([{"watermark": 9, "idle": True, "splits": {"a": [20, True]}},
    ...        {"watermark": 4, "idle": True, "splits": {"b": [7, False]}}])["splits"]
    {'a': [20, True], 'b': [7, False]}
    """
    out: dict[str, Any] = {
        "watermark": min(int(o["watermark"]) for o in olds),
        "idle": all(bool(o.get("idle")) for o in olds),
    }
    splits: dict[str, list[Any]] = {}
    for o in olds:
        for split, saved in (o.get("splits") or {}).items():
            cur = splits.get(split)
            if cur is None or saved[0] < cur[0]:
                # a split several old subtasks had (the "*" of readers without splits):
                # the one furthest behind, its chunk in progress with it
                splits[split] = [*saved[:1], saved[1] and (cur is None or cur[1]), *saved[2:]]
            else:
                cur[1] = cur[1] and saved[1]
    if splits:
        out["splits"] = splits
    layouts = {repr(o.get("layout")) for o in olds}
    channels = [o["channels"] for o in olds if o.get("channels") is not None]
    if len(layouts) == 1 and channels and len({len(c) for c in channels}) == 1:
        out["layout"] = olds[0].get("layout")
        out["channels"] = [
            [min(int(c[i][0]) for c in channels), all(bool(c[i][1]) for c in channels)]
            for i in range(len(channels[0]))
        ]
    return out


def restored_watermark(time: dict[str, Any] | None) -> int:
    return MIN_WATERMARK if time is None else int(time["watermark"])
