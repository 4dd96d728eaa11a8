"""Splits partitioned by key group, so a keyed operator can read them without a shuffle.

A source declared *key-grouped* promises that every record of a split has a
key in that split's key-group range (Kafka Streams calls such inputs
co-partitioned). Each reader then takes the splits whose whole range lies in
its own subtask's range (:meth:`KeyGroupRange.owner`, Flink's formula): the
same subtask whose keyed operator owns those keys' state, so
``stream.reinterpret_as_keyed(key)`` can chain the operator to the source.

Why this stays right across restores and rescaling: a reader restores its
positions by split id from the union of the old readers' positions, and a
keyed operator its state by key group; both follow the same function of
(range, subtask, parallelism), so after any restore a split is read where
its keys' state is. A parallelism at which some split's range straddles two
subtasks cannot work without a shuffle and is refused before anything is
read, with the parallelisms that would work. A split that breaks its promise
is caught per record by the operator's arrival check
(:mod:`aiostream_ckpt.runtime.key_group_check`), before it touches state.

In a sharded job (``--shard I/N``) every split must also lie in one shard
(shard I owns the key groups subtask I of N would): a topic of N
partitions written by key group gives partition I to shard I. Inputs whose
splits straddle shards, or that leave a shard without a split (more shards
than partitions), are refused before anything is read.

Files carry their range in their name, ``kg-<start>-<end>-of-<max>...``
(``kg-00000-00063-of-128.jsonl``), so any tool can write them;
:func:`write_key_grouped` does it here. A Kafka topic of N partitions is
key-grouped when partition j holds the key groups subtask j of N owns: the
Kafka sink writes it so with :class:`KeyGroupPartitioner`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.errors import ConfigError, PartitioningError
from aiostream_ckpt.keygroups import (
    DEFAULT_MAX_PARALLELISM,
    KeyGroupRange,
    Shard,
    key_group_of,
    operator_index_for_key_group,
)

_FILE_NAME = re.compile(r"kg-(\d+)-(\d+)-of-(\d+)(?!\d)")


def key_grouped_file_name(key_groups: KeyGroupRange, max_parallelism: int) -> str:
    """Name of a JSON-lines file holding the keys of ``key_groups``.

    >>> key_grouped_file_name(KeyGroupRange(0, 63), 128)
    'kg-00000-00063-of-128.jsonl'
    """
    return f"kg-{key_groups.start:05d}-{key_groups.end:05d}-of-{max_parallelism}.jsonl"


def file_key_groups(path: str) -> tuple[KeyGroupRange, int]:
    """Key-group range and max parallelism a file's name declares.

    >>> file_key_groups("/in/kg-00064-00127-of-128.jsonl")
    (KeyGroupRange(start=64, end=127), 128)
    """
    m = _FILE_NAME.match(os.path.basename(path))
    if m is None:
        raise ConfigError(
            f"file {path} is in a key-grouped input but its name does not say its key groups: "
            "expected kg-<start>-<end>-of-<max parallelism>... (see write_key_grouped)"
        )
    start, end, maxp = (int(g) for g in m.groups())
    if not 0 <= start <= end < maxp:
        raise ConfigError(f"file {path}: key groups {start}-{end} are not within 0..{maxp - 1}")
    return KeyGroupRange(start, end), maxp


def assign_key_grouped(
    ranges: Mapping[str, KeyGroupRange],
    declared_max_parallelism: int,
    ctx: ConnectorContext,
    *,
    source: str,
) -> list[str]:
    """Return the splits ``ctx``'s subtask reads: those whose range its key groups hold.

    Raises :class:`PartitioningError` when the splits were written for
    another ``job.max_parallelism`` or some split straddles two subtasks at
    ``ctx.parallelism``; the message lists the parallelisms that would work.
    """
    maxp = ctx.max_parallelism
    if declared_max_parallelism != maxp:
        raise PartitioningError(
            f"{source}: its splits are partitioned into {declared_max_parallelism} key groups, "
            f"but the job runs with job.max_parallelism={maxp}: key groups would not match; "
            f"run with job.max_parallelism={declared_max_parallelism} or repartition the input"
        )
    shard = ctx.shard
    if shard.sharded:
        _check_shards(ranges, shard, maxp, source)
    p = ctx.parallelism
    owners = {split: r.owner(p, maxp) for split, r in ranges.items()}
    straddling = [s for s, owner in owners.items() if owner is None]
    if straddling:
        split = straddling[0]
        r = ranges[split]
        first = operator_index_for_key_group(r.start, p, maxp)
        last = operator_index_for_key_group(r.end, p, maxp)
        # the first few parallelisms (in each shard) that work (an error path: stop early)
        fits = _first_fits(ranges, maxp, lambda q: shard.parallelism(q), maxp // shard.count)
        what = f"parallelism {p}" if not shard.sharded else f"the job's {p} (shard {shard})"
        raise PartitioningError(
            f"{source}: split {split} holds key groups {r.start}-{r.end}, which subtasks "
            f"{first}-{last} of {what} share ({len(straddling)} split(s) like it): "
            "it cannot be read without a shuffle at this parallelism; run at parallelism "
            f"{', '.join(map(str, fits[:8]))}{'...' if len(fits) > 8 else ''} or repartition "
            "the input into finer splits"
        )
    return [split for split, owner in owners.items() if owner == ctx.subtask_index]


def _first_fits(
    ranges: Mapping[str, KeyGroupRange], maxp: int, scale: Callable[[int], int], most: int
) -> list[int]:
    """Return the first counts q (at most 9) at which every split lies in one of ``scale(q)``."""
    return list(
        islice(
            (
                q
                for q in range(1, most + 1)
                if all(x.owner(scale(q), maxp) is not None for x in ranges.values())
            ),
            9,
        )
    )


def _check_shards(
    ranges: Mapping[str, KeyGroupRange], shard: Shard, maxp: int, source: str
) -> None:
    """Refuse an input whose splits do not each lie in one shard, or leave a shard without one.

    A split read by one shard must hold only that shard's keys: shards
    share no state. A topic of P partitions written by key group serves N
    shards when each partition's key groups lie in one shard (N a divisor
    of P when ``job.max_parallelism`` is a multiple of P).
    """
    n = shard.count
    owners = {split: r.owner(n, maxp) for split, r in ranges.items()}
    straddling = [s for s, owner in owners.items() if owner is None]
    if straddling or shard.index not in owners.values():
        fits = _first_fits(ranges, maxp, lambda q: q, maxp)
        counts = f"{', '.join(map(str, fits[:8]))}{'...' if len(fits) > 8 else ''}"
        if len(ranges) < n:
            why = (
                f"{len(ranges)} split(s) (partitions or files) for {n} shards: more shards "
                "than the input has partitions"
            )
        elif straddling:
            split = straddling[0]
            r = ranges[split]
            first, last = shard.of_key_group(r.start, maxp), shard.of_key_group(r.end, maxp)
            why = (
                f"split {split} holds key groups {r.start}-{r.end}, which shards "
                f"{first}-{last} of {n} share ({len(straddling)} split(s) like it)"
            )
        else:
            own = shard.key_groups(maxp)
            why = f"no split holds the key groups of shard {shard} ({own.start}-{own.end})"
        raise PartitioningError(
            f"{source}: {why}: each shard must read whole partitions of its own key groups; "
            f"run {counts} shard(s), or repartition the input"
        )


def partition_key_groups(
    partitions: int, max_parallelism: int, *, source: str
) -> list[KeyGroupRange]:
    """Return the key groups of each partition, as :class:`KeyGroupPartitioner` lays them out.

    >>> partition_key_groups(4, 128, source="s")[1]
    KeyGroupRange(start=32, end=63)
    """
    if not 1 <= partitions <= max_parallelism:
        raise PartitioningError(
            f"{source}: {partitions} partitions cannot each hold whole key groups of "
            f"job.max_parallelism={max_parallelism}"
        )
    return [KeyGroupRange.for_operator(j, partitions, max_parallelism) for j in range(partitions)]


@dataclass(frozen=True)
class KeyGroupPartitioner:
    """Kafka sink partitioner: partition j of N gets the key groups subtask j of N owns.

    ``key_selector`` must be the consuming job's (what its
    ``reinterpret_as_keyed`` is given) and ``max_parallelism`` its
    ``job.max_parallelism``: a ``KafkaSource(..., key_grouped=True)`` reading
    the topic then hands each partition to the subtask owning its keys. The
    Kafka record key (``key_fn``) is independent of it.
    """

    key_selector: Callable[[Any], Any]
    max_parallelism: int = DEFAULT_MAX_PARALLELISM

    def partition_of_key(self, key: Any, partitions: int) -> int:
        """Return the partition (of ``partitions``, numbered from 0) of stream key ``key``.

        >>> KeyGroupPartitioner(str).partition_of_key("app-0", 2)  # key group 67
        1
        """
        maxp = self.max_parallelism
        return operator_index_for_key_group(key_group_of(key, maxp), partitions, maxp)


def write_key_grouped(
    records: Iterable[Any],
    key_selector: Callable[[Any], Any],
    directory: str | Path,
    *,
    parts: int,
    max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    serializer: Callable[[Any], bytes] = orjson.dumps,
) -> list[Path]:
    """Write ``records`` as JSON lines into ``parts`` files partitioned by key group.

    File ``j`` holds the records whose key is in the key groups subtask ``j``
    of ``parts`` owns (named by :func:`key_grouped_file_name`), each file in
    input order. A job reads them without a shuffle at any parallelism whose
    subtasks' ranges hold whole files (``parts`` itself and its divisors
    when ``max_parallelism`` is a multiple of ``parts``). Files appear
    complete (written beside, then renamed). Returns their paths.
    """
    if not 1 <= parts <= max_parallelism:
        raise ConfigError(f"parts must be within 1..{max_parallelism}, got {parts}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ranges = [KeyGroupRange.for_operator(j, parts, max_parallelism) for j in range(parts)]
    paths = [out / key_grouped_file_name(r, max_parallelism) for r in ranges]
    temps = [p.with_name(f".{p.name}.tmp") for p in paths]
    files = [open(t, "wb") for t in temps]  # noqa: SIM115 - closed below
    part_of: dict[Any, int] = {}  # key -> file: its group is computed once per key
    try:
        for rec in records:
            key = key_selector(rec)
            j = part_of.get(key)
            if j is None:
                kg = key_group_of(key, max_parallelism)
                j = part_of[key] = operator_index_for_key_group(kg, parts, max_parallelism)
            files[j].write(serializer(rec) + b"\n")
    finally:
        for f in files:
            f.close()
    for tmp, path in zip(temps, paths, strict=True):
        os.replace(tmp, path)
    return paths
