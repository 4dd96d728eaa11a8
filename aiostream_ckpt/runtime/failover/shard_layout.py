"""One shard layout per checkpoint directory, unless a rescale says otherwise.

Each shard keeps its chain in ``<checkpoint.dir>/shard-I-of-N``. A daemon
started fresh (no checkpoint of its own, no savepoint to restore) beside
checkpoints of another layout (``--shard 0/3`` where shards of 2 ran, or an
unsharded run where shards ran, or the reverse) would read its input from
the start again while that run's output stands: its records would be
committed twice. So such a start is refused, naming what is there; the
way from N shards to M is a rescale through savepoints, which gives each new
shard a restore point (``job.restore_from``), and a shard that has
checkpoints of its own resumes from them whatever else the directory holds.
"""

from __future__ import annotations

from pathlib import Path

from aiostream_ckpt.checkpoint.storage import CheckpointStorage
from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.keygroups import Shard


def _has_history(directory: Path) -> bool:
    """Whether ``directory`` has held a checkpoint or savepoint id (kept, set aside or stopped)."""
    if not directory.is_dir():
        return False
    return CheckpointStorage(directory, create=False).next_checkpoint_id() > 1


def other_layouts(root: Path, shard: Shard) -> dict[str, list[str]]:
    """Return the layouts in ``root`` other than ``shard``'s that hold checkpoints.

    Keys are ``"N shards"`` or ``"unsharded"``; values the directories.
    """
    found: dict[str, list[str]] = {}
    if not root.is_dir():
        return found
    if shard.sharded and _has_history(root):
        found.setdefault("unsharded", []).append(str(root))
    for child in sorted(root.iterdir()):
        other = Shard.from_dirname(child.name)
        if other is None or (shard.sharded and other.count == shard.count):
            continue
        if _has_history(child):
            found.setdefault(f"{other.count} shards", []).append(child.name)
    return found


def check_shard_layout(config: JobConfig) -> None:
    """Refuse a fresh start beside checkpoints of another shard layout (module docstring)."""
    root, own = config.checkpoint.directory, config.checkpoint_dir()
    if root is None or own is None or config.restore_from is not None or _has_history(own):
        return
    found = other_layouts(root, config.shard)
    if not found:
        return
    this = f"shard {config.shard}" if config.shard.sharded else "the whole job (no --shard)"
    there = "; ".join(f"{layout}: {', '.join(dirs)}" for layout, dirs in sorted(found.items()))
    raise ConfigError(
        f"checkpoint.dir {root} holds checkpoints of this job run in another layout ({there}), "
        f"and {this} has none of its own: started fresh it would read the input again beside "
        "that run's output. To change the number of shards, rescale through savepoints "
        "(aiostream-ckpt rescale, docs/shards.md); to start over, give the job a new "
        "checkpoint.dir"
    )
