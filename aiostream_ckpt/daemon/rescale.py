"""``aiostream-ckpt rescale``: the restore point that takes a job from N shards to M.

The N daemons are stopped with a savepoint each (``savepoint stop``, or
SIGTERM with ``shutdown.mode=savepoint``): each shard's output up to its
savepoint is committed, nothing after it. This command finds those
savepoints (each shard's stop-with-savepoint, recorded in its directory
under ``checkpoint.dir``; or the savepoints given), checks they are every
shard of one layout, and writes one rescale point
(:mod:`aiostream_ckpt.checkpoint.rescale`). The M new daemons then start
with ``--shard J/M --from-savepoint <rescale point>`` on the same
``checkpoint.dir``. Nothing is written when the set is partial or a shard
ran on after its savepoint.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import orjson

from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.checkpoint.rescale import merge_shard_savepoints, write_rescale_point
from aiostream_ckpt.checkpoint.storage import CheckpointStorage, read_checkpoint
from aiostream_ckpt.errors import ConfigError, RestoreRefusedError
from aiostream_ckpt.keygroups import Shard


def stopped_shards(root: Path, from_shards: int | None = None) -> list[CompletedCheckpoint]:
    """Return the stop-with-savepoint savepoint of every shard of the layout found in ``root``.

    Raises :class:`RestoreRefusedError` naming each shard (and its key groups)
    that has none, or that ran on after it (a newer checkpoint).
    """
    layouts: dict[int, dict[int, Path]] = {}
    if CheckpointStorage(root, create=False).stop_savepoint() is not None:
        layouts[1] = {0: root}  # the job ran unsharded
    if root.is_dir():
        for child in root.iterdir():
            shard = Shard.from_dirname(child.name)
            if shard is not None and child.is_dir():
                layouts.setdefault(shard.count, {})[shard.index] = child
    stopped = {
        n: dirs
        for n, dirs in layouts.items()
        if any(CheckpointStorage(d, create=False).stop_savepoint() for d in dirs.values())
    }
    if from_shards is not None:
        n = from_shards
        if n not in layouts:
            raise ConfigError(f"{root} holds no shards of a layout of {n}")
    elif len(stopped) == 1:
        n = next(iter(stopped))
    elif not stopped:
        raise RestoreRefusedError(
            f"no shard in {root} was stopped with a savepoint: stop every shard with "
            "`aiostream-ckpt savepoint stop` (or SIGTERM with shutdown.mode=savepoint) first"
        )
    else:
        counts = ", ".join(map(str, sorted(stopped)))
        raise ConfigError(
            f"{root} holds stopped shards of several layouts ({counts} shards): say which "
            "with --from-shards N"
        )
    points: list[CompletedCheckpoint] = []
    problems: list[tuple[Shard, str]] = []
    maxp: int | None = None
    for i in range(n):
        shard = Shard(i, n)
        directory = layouts[n].get(i, root / shard.dirname)
        storage = CheckpointStorage(directory, create=False)
        stop = storage.stop_savepoint() if directory.is_dir() else None
        if stop is None:
            problems.append((shard, f"has no stop-with-savepoint in {directory}"))
            continue
        newer = next(storage.completed_newest_first(), None)
        if newer is not None and newer > stop[0]:
            problems.append(
                (
                    shard,
                    f"ran on after its stop-with-savepoint {stop[0]} (checkpoint {newer} is "
                    "newer): its later output would be produced again",
                )
            )
            continue
        point = read_checkpoint(stop[1])
        maxp = point.max_parallelism
        points.append(point)
    if problems:
        said = [
            f"shard {shard}"
            + (f" (key groups {r.start}-{r.end} of {maxp})" if maxp is not None else "")
            + f" {why}"
            for shard, why in problems
            for r in [shard.key_groups(maxp or 1)]
        ]
        raise RestoreRefusedError(
            f"cannot rescale the {n} shard(s) in {root}: " + "; ".join(said) + ". Stop "
            "every shard with a savepoint (`aiostream-ckpt savepoint stop`) and do not run "
            "them again before the rescale"
        )
    return points


def rescale_main(args: argparse.Namespace) -> int:
    """Write the rescale point; print it (JSON) and how to start the new shards."""
    if args.shards < 1:
        raise ConfigError(f"--shards must be at least 1, not {args.shards}")
    if args.savepoints is not None:
        given = [Path(s).expanduser() for s in str(args.savepoints).split(",") if s.strip()]
        points = [read_checkpoint(p) for p in given]
        base = given[0].resolve().parent if given else Path.cwd()
    else:
        root = args.checkpoint_dir.expanduser()
        points = stopped_shards(root, args.from_shards)
        base = root.resolve()
    old = len(points)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    out = (args.out or base / f"rescale-{old}-to-{args.shards}-{stamp}").expanduser().resolve()
    merged = merge_shard_savepoints(points, out)
    if args.shards > merged.max_parallelism:
        raise ConfigError(
            f"--shards {args.shards}: at most the job's {merged.max_parallelism} key groups"
        )
    write_rescale_point(merged)
    print(
        orjson.dumps(
            {
                "restore_point": str(out),
                "job": merged.job_name,
                "checkpoint_id": merged.checkpoint_id,
                "from_shards": old,
                "to_shards": args.shards,
                "savepoints": [str(p.directory) for p in points],
            }
        ).decode()
    )
    print(
        f"rescale point of job {merged.job_name!r} ({old} shard(s) -> {args.shards}): {out}\n"
        f"start each new shard J = 0..{args.shards - 1} on the same checkpoint.dir with\n"
        f"  aiostream-ckpt run APP --shard J/{args.shards} --from-savepoint {out}\n"
        "and keep the old savepoints: the rescale point refers to their state files",
        file=sys.stderr,
    )
    return 0
