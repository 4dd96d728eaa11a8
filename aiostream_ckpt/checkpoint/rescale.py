"""One restore point from the savepoints of every shard: rescaling N shards to M.

N shards are one job at parallelism ``N * p`` split over daemons (see
:class:`~aiostream_ckpt.keygroups.Shard`), and each shard's savepoint holds
the state of its own subtasks of that job. Put together, the savepoints of
all N shards are one savepoint of the whole job: :func:`merge_shard_savepoints`
writes that as a *rescale point*, a savepoint directory whose ``_metadata``
lists every old subtask's state, its state files staying where they are
(referenced by paths relative to the rescale point). Each of M new shards
then restores from it as from any savepoint taken at another parallelism:
its key groups' state from whichever old shards held them, its splits'
positions from the union of the old readers', its sinks' pending
transactions from the merged writer states.

Which shard a savepoint holds is read from the savepoint itself: shard I of
N at parallelism p acknowledged, for every operator, the job's subtasks
``I*p .. I*p+p-1`` of ``N*p`` (:func:`savepoint_shard`). A set that lacks a
shard is refused, naming the key groups nobody would restore, before
anything is written; so are savepoints of different jobs, layouts or key
groups, and one shard given twice.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiostream_ckpt.checkpoint.metadata import METADATA_FILE, CompletedCheckpoint, encode_metadata
from aiostream_ckpt.checkpoint.storage import write_atomically
from aiostream_ckpt.errors import CheckpointError, RestoreRefusedError
from aiostream_ckpt.keygroups import Shard


def savepoint_shard(point: CompletedCheckpoint) -> Shard:
    """Return the shard (of its layout) whose state ``point`` holds.

    Raises :class:`CheckpointError` when its subtasks are not one shard's
    (a merged rescale point, or a savepoint missing a task's state).
    """
    layouts: set[Shard] = set()
    for uid, op in sorted(point.operators.items()):
        subtasks = sorted(int(s) for s in op.get("subtasks", {}))
        p, whole = len(subtasks), int(op["parallelism"])
        first = subtasks[0] if subtasks else -1
        if not p or whole % p or first % p or subtasks != list(range(first, first + p)):
            raise CheckpointError(
                f"{point.directory}: operator {uid!r} has the state of subtasks {subtasks} of "
                f"{whole}, which is not one shard's (shard I of N holds I*p..I*p+p-1 of N*p)"
            )
        layouts.add(Shard(first // p, whole // p))
    if len(layouts) != 1:
        found = ", ".join(sorted(map(str, layouts))) or "no operator state"
        raise CheckpointError(f"{point.directory}: its operators are of several shards: {found}")
    return layouts.pop()


def merge_shard_savepoints(
    points: Sequence[CompletedCheckpoint], directory: Path
) -> CompletedCheckpoint:
    """Return the restore point that holds ``points``, the savepoints of every shard.

    ``directory`` is where the rescale point will live: state file paths are
    made relative to it. Raises :class:`RestoreRefusedError` for a partial
    set, :class:`CheckpointError` for savepoints that do not belong together.
    """
    if not points:
        raise CheckpointError("no savepoints to rescale from")
    first = points[0]
    for p in points[1:]:
        if p.job_name != first.job_name or p.max_parallelism != first.max_parallelism:
            raise CheckpointError(
                f"savepoints of different jobs: {first.directory} is of job {first.job_name!r} "
                f"({first.max_parallelism} key groups), {p.directory} of job {p.job_name!r} "
                f"({p.max_parallelism} key groups)"
            )
    by_shard: dict[int, CompletedCheckpoint] = {}
    counts: set[int] = set()
    for p in points:
        shard = savepoint_shard(p)
        counts.add(shard.count)
        if shard.index in by_shard:
            raise CheckpointError(
                f"shard {shard} is given twice: {by_shard[shard.index].directory} and {p.directory}"
            )
        by_shard[shard.index] = p
    if len(counts) != 1:
        raise CheckpointError(
            f"savepoints of different shard layouts ({', '.join(map(str, sorted(counts)))} "
            "shards): give the savepoints of one layout, every shard of it once"
        )
    n = counts.pop()
    missing = [i for i in range(n) if i not in by_shard]
    if missing:
        maxp = first.max_parallelism
        groups = ", ".join(
            f"shard {Shard(i, n)}: key groups {r.start}-{r.end}"
            for i in missing
            for r in [Shard(i, n).key_groups(maxp)]
        )
        raise RestoreRefusedError(
            f"the savepoints are of {len(by_shard)} of the {n} shards of job "
            f"{first.job_name!r}; missing {groups} of {maxp}: their state, positions and "
            "pending output would be lost. Take a savepoint of every shard "
            "(stop-with-savepoint) and give them all"
        )
    ordered = [by_shard[i] for i in range(n)]
    return CompletedCheckpoint(
        checkpoint_id=max(p.checkpoint_id for p in ordered),
        is_savepoint=True,
        job_name=first.job_name,
        trigger_time=max(p.trigger_time for p in ordered),
        completion_time=max(p.completion_time for p in ordered),
        duration_seconds=max(p.duration_seconds for p in ordered),
        max_parallelism=first.max_parallelism,
        operators=_merged_operators(ordered, directory),
        tasks={
            f"{Shard(i, n).dirname}/{task}": figures
            for i, p in enumerate(ordered)
            for task, figures in p.tasks.items()
        },
        size_bytes=sum(p.size_bytes for p in ordered),
        directory=directory,
        root=directory,
    )


def _merged_operators(
    points: Sequence[CompletedCheckpoint], directory: Path
) -> dict[str, dict[str, Any]]:
    uids = {uid for p in points for uid in p.operators}
    out: dict[str, dict[str, Any]] = {}
    for uid in sorted(uids):
        present = [p for p in points if uid in p.operators]
        if len(present) != len(points):
            lacking = next(p for p in points if uid not in p.operators)
            raise CheckpointError(
                f"operator {uid!r} has state in some shards' savepoints but not in "
                f"{lacking.directory}: were they taken of the same job version?"
            )
        parallelisms = {int(p.operators[uid]["parallelism"]) for p in present}
        if len(parallelisms) != 1:
            raise CheckpointError(
                f"operator {uid!r} ran at different parallelisms in the shards: {parallelisms}"
            )
        subtasks: dict[str, Any] = {}
        for p in present:
            for sub, entry in p.operators[uid]["subtasks"].items():
                subtasks[sub] = _relocated(entry, p.root, directory)
        out[uid] = {"parallelism": parallelisms.pop(), "subtasks": subtasks}
    return out


def _relocated(entry: dict[str, Any], root: Path, directory: Path) -> dict[str, Any]:
    """Return a subtask entry whose state file paths are relative to ``directory``."""
    handle = entry.get("keyed")
    if not handle:
        return dict(entry)

    def moved(path: str) -> str:
        return os.path.relpath(root.resolve() / path, directory.resolve())

    chain = [{**e, "path": moved(e["path"])} for e in handle.get("chain", [])]
    files = [moved(f) for f in handle.get("files", [])]
    return {**entry, "keyed": {**handle, "chain": chain, "files": files}}


def write_rescale_point(point: CompletedCheckpoint) -> Path:
    """Write ``point`` (from :func:`merge_shard_savepoints`) durably into its directory."""
    directory = point.directory
    try:
        directory.mkdir(parents=True, exist_ok=False)
    except FileExistsError:
        msg = f"{directory} already exists: give the rescale point a new directory"
        raise CheckpointError(msg) from None
    except OSError as exc:
        raise CheckpointError(f"cannot create {directory}: {exc}") from exc
    write_atomically(directory / METADATA_FILE, encode_metadata(point.to_json()))
    return directory
