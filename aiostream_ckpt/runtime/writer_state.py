"""Which restored writer state a sink (or dead-letter) writer instance gets.

Keyed state is redistributed by key group and source positions are unioned,
but a writer's state lists *transactions* (pre-committed, not yet committed)
that belong to one old subtask. When the parallelism is unchanged, instance i
gets old instance i's state. When it changed, some old instance has no
successor with its index (restore at a lower parallelism) and its pending
transactions would be lost, so the rule is:

- every new instance gets the **merged** state of all old instances, built by
  the writer's ``merge_states`` (see
  :class:`~aiostream_ckpt.connectors.base.SinkWriter`);
- committing a listed transaction is idempotent, so it does not matter which
  new instance (or how many) commits it;
- a writer aborts and cleans up only what belongs to its own subtask (and, by
  convention, subtask 0 also what belongs to subtasks at or above the new
  parallelism), so no instance aborts what another may still commit.

A writer may name ``shared_state_keys``: state that only all old instances
together make true (the Kafka sink's ``output_end``, where the old run's
checkpointed output ends in each partition). Instance i then gets those keys
from the merged state even when the parallelism is unchanged.

A writer without ``merge_states`` cannot be rescaled safely: that is a
:class:`StateMigrationError` at startup rather than silently lost output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.errors import StateMigrationError

MergeFn = Callable[[Sequence[Mapping[str, Any] | None]], dict[str, Any]]


def old_states(restored: CompletedCheckpoint, uid: str, key: str) -> dict[int, dict[str, Any]]:
    """Old subtask index -> its ``key`` entry of the operator state (dict states only)."""
    out: dict[int, dict[str, Any]] = {}
    for sub, st in restored.subtask_states(uid).items():
        value = (st.get("operator") or {}).get(key)
        if isinstance(value, dict):
            out[sub] = value
    return out


def restored_writer_state(
    restored: CompletedCheckpoint | None,
    uid: str | None,
    key: str,
    *,
    subtask: int,
    parallelism: int,
    writer: object,
) -> dict[str, Any] | None:
    """Return the state for ``writer.recover`` of instance ``subtask`` of ``parallelism``."""
    if restored is None or uid is None:
        return None
    states = old_states(restored, uid, key)
    old_p = int(restored.operators.get(uid, {}).get("parallelism", parallelism))
    merge: MergeFn | None = getattr(writer, "merge_states", None)
    if old_p == parallelism:
        own = states.get(subtask)
        shared: tuple[str, ...] = getattr(writer, "shared_state_keys", ())
        if own is None or not shared or not callable(merge):
            return own
        merged = merge([states.get(i) for i in range(old_p)])
        return {**own, **{k: merged[k] for k in shared if k in merged}}
    if not states:
        return None
    if not callable(merge):
        raise StateMigrationError(
            f"operator {uid!r}: {key} state was taken at parallelism {old_p} and cannot be "
            f"restored at {parallelism}: {type(writer).__name__} has no merge_states()"
        )
    return merge([states.get(i) for i in range(old_p)])
