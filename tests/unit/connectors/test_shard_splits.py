"""How sources spread their splits over shards: whole blocks, and key groups that line up."""

from __future__ import annotations

import pytest

from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.generator import GeneratorSource
from aiostream_ckpt.connectors.key_grouped import assign_key_grouped, partition_key_groups
from aiostream_ckpt.connectors.splits import assign_splits
from aiostream_ckpt.errors import PartitioningError
from aiostream_ckpt.keygroups import KeyGroupRange, Shard


def _ctx(shard: Shard, local: int, p: int) -> ConnectorContext:
    return ConnectorContext(
        "job", "src", shard.subtask(local, p), shard.parallelism(p), shard=shard
    )


def test_every_split_is_read_once_by_the_subtasks_of_one_shard() -> None:
    splits = [f"t:{j}" for j in range(7)]
    for n in (1, 2, 3, 7):
        for p in (1, 2, 3):
            got = [
                (i, s)
                for i in range(n)
                for local in range(p)
                for s in assign_splits(splits, _ctx(Shard(i, n), local, p), source="s")
            ]
            assert sorted(s for _, s in got) == splits
            # a shard's splits are a contiguous block: the sorted order is kept
            assert [i for i, _ in sorted(got, key=lambda x: x[1])] == sorted(i for i, _ in got)


def test_without_shards_the_round_robin_is_as_before() -> None:
    ctx = ConnectorContext("job", "src", 1, 3)
    assert assign_splits(list(range(8)), ctx, source="s") == [1, 4, 7]


def test_fewer_splits_than_shards_is_refused() -> None:
    with pytest.raises(PartitioningError, match=r"2 split\(s\).*for 3 shards: shard 2/3"):
        assign_splits(["a", "b"], _ctx(Shard(2, 3), 0, 1), source="generator 'g'")


def test_the_generator_hands_each_shard_its_own_splits() -> None:
    src = GeneratorSource(100, splits=4)
    own = [src.create_reader(_ctx(Shard(i, 2), 0, 1)).snapshot_position() for i in (0, 1)]
    assert [sorted(o) for o in own] == [["split-0", "split-1"], ["split-2", "split-3"]]


def _topic(partitions: int) -> dict[str, KeyGroupRange]:
    layout = partition_key_groups(partitions, 128, source="t")
    return {f"t:{j}": r for j, r in enumerate(layout)}


def test_a_key_grouped_topic_gives_partition_i_of_n_to_shard_i() -> None:
    ranges = _topic(4)
    got = {
        (i, local): assign_key_grouped(ranges, 128, _ctx(Shard(i, 2), local, 2), source="s")
        for i in (0, 1)
        for local in (0, 1)
    }
    assert got == {(0, 0): ["t:0"], (0, 1): ["t:1"], (1, 0): ["t:2"], (1, 1): ["t:3"]}


def test_partitions_that_straddle_shards_are_refused_naming_the_counts_that_work() -> None:
    with pytest.raises(PartitioningError) as info:
        assign_key_grouped(_topic(4), 128, _ctx(Shard(0, 3), 0, 1), source="Kafka source 'k'")
    text = str(info.value)
    assert "Kafka source 'k'" in text and "split t:1 holds key groups 32-63" in text, text
    assert "shards 0-1 of 3 share" in text and "run 1, 2, 4 shard(s)" in text, text


def test_more_shards_than_partitions_is_refused() -> None:
    with pytest.raises(PartitioningError, match=r"2 split\(s\).*for 4 shards: more shards than"):
        assign_key_grouped(_topic(2), 128, _ctx(Shard(3, 4), 0, 1), source="s")


def test_a_shard_split_over_subtasks_names_the_parallelism_in_each_shard() -> None:
    with pytest.raises(PartitioningError) as info:
        assign_key_grouped(_topic(2), 128, _ctx(Shard(1, 2), 0, 2), source="s")
    text = str(info.value)
    assert "of the job's 4 (shard 1/2)" in text and "run at parallelism 1 " in text, text
