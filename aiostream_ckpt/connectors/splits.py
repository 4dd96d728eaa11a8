"""Which splits a reader takes: round-robin over the subtasks, within its shard first.

A source that is not partitioned by key group (plain files, a topic keyed
by Kafka's own partitioner, generated events) deals its splits round-robin
over the subtasks, as Flink's sources do. In a sharded job
(:class:`~aiostream_ckpt.keygroups.Shard`) each shard first takes a
contiguous block of the sorted splits (shard I of N: the splits j with
``j * N // splits == I``), then deals that block over its own subtasks: every
split is read by exactly one shard, and no shard is left without one
(fewer splits than shards is refused). The records of such splits are not
in their shard's key groups: a keyed operator after them fails on the first
key of another shard (see ``runtime.partitioners.outside_shard``), so a
sharded job keys only inputs written by key group (:mod:`.key_grouped`).

Restores do not depend on this rule: a reader resumes its splits from the
union of every old reader's positions, by split id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.errors import PartitioningError

T = TypeVar("T")


def assign_splits(splits: Sequence[T], ctx: ConnectorContext, *, source: str) -> list[T]:
    """Return the splits ``ctx``'s subtask reads (see the module docstring).

    >>> assign_splits("abcde", ConnectorContext("job", "src", 1, 2), source="s")
    ['b', 'd']
    """
    shard = ctx.shard
    if not shard.sharded:
        return list(splits[ctx.subtask_index :: ctx.parallelism])
    n = len(splits)
    if n < shard.count:
        raise PartitioningError(
            f"{source}: {n} split(s) (partitions or files) for {shard.count} shards: shard "
            f"{shard} would read nothing; run at most {n} shard(s), or give the input more "
            "partitions"
        )
    block = [s for j, s in enumerate(splits) if j * shard.count // n == shard.index]
    local_p = ctx.parallelism // shard.count
    local = ctx.subtask_index - shard.subtask(0, local_p)
    return block[local::local_p]
