"""Shards: shard I of N is the job's subtasks I*p..I*p+p-1 of N*p, key groups and all."""

from __future__ import annotations

import itertools

import pytest

from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.keygroups import (
    WHOLE_JOB,
    KeyGroupRange,
    Shard,
    key_group_of,
    operator_index_for_key_group,
)


@pytest.mark.parametrize("maxp", [1, 7, 128, 1000])
def test_a_shards_subtasks_own_exactly_its_key_groups(maxp: int) -> None:
    """For every layout that fits: the global subtasks' ranges tile the shard's range."""
    for n in range(1, min(maxp, 9) + 1):
        for p in range(1, maxp // n + 1):
            if p > 6:
                break
            for i in range(n):
                shard = Shard(i, n)
                own = shard.key_groups(maxp)
                gp = shard.parallelism(p)
                ranges = [
                    KeyGroupRange.for_operator(shard.subtask(s, p), gp, maxp) for s in range(p)
                ]
                assert ranges[0].start == own.start and ranges[-1].end == own.end
                for a, b in itertools.pairwise(ranges):
                    assert b.start == a.end + 1
                for kg in range(own.start, own.end + 1):
                    owner = operator_index_for_key_group(kg, gp, maxp)
                    assert shard.subtask(0, p) <= owner < shard.subtask(p, p)
                    assert shard.of_key_group(kg, maxp) == i


def test_the_shards_of_a_layout_cover_every_key_group_once() -> None:
    maxp = 128
    for n in (1, 2, 3, 5, 128):
        seen = [kg for i in range(n) for kg in _groups(Shard(i, n).key_groups(maxp))]
        assert seen == list(range(maxp))


def _groups(r: KeyGroupRange) -> range:
    return range(r.start, r.end + 1)


def test_a_key_lives_in_the_shard_of_its_key_group() -> None:
    kg = key_group_of("app-0", 128)  # 67: the second half
    assert Shard(0, 2).of_key_group(kg, 128) == 1
    assert kg in Shard(1, 2).key_groups(128)


def test_the_whole_job_is_one_shard_with_the_local_indexes() -> None:
    assert not WHOLE_JOB.sharded
    assert WHOLE_JOB.subtask(3, 4) == 3 and WHOLE_JOB.parallelism(4) == 4
    assert WHOLE_JOB.key_groups(128) == KeyGroupRange(0, 127)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("2/2", "shard 2 of 2 does not exist"),
        ("-1/2", "shard -1 of 2 does not exist"),
        ("0/0", "shard 0 of 0 does not exist"),
        ("1", "I/N: shard I of N shards, e.g. 0/2, not '1'"),
        ("a/b", "not 'a/b'"),
    ],
)
def test_a_bad_shard_is_refused_naming_it(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Shard.parse(text)


def test_more_shards_than_key_groups_is_refused_by_the_config() -> None:
    with pytest.raises(ConfigError, match=r"job.shard='3/200'.*at most job.max_parallelism"):
        JobConfig(max_parallelism=128, shard=Shard(3, 200)).validate()
    JobConfig(max_parallelism=128, shard=Shard(3, 128)).validate()


def test_each_shard_keeps_its_checkpoints_and_state_in_its_own_directory(tmp_path) -> None:
    whole = JobConfig().with_checkpoint_dir(tmp_path / "ck")
    assert whole.checkpoint_dir() == tmp_path / "ck"
    sharded = JobConfig(shard=Shard(1, 3)).with_checkpoint_dir(tmp_path / "ck")
    assert sharded.checkpoint_dir() == tmp_path / "ck" / "shard-1-of-3"
    assert sharded.local_state_root() == tmp_path / "ck" / "shard-1-of-3" / "local-state"
    assert sharded.dead_letter_dir() == tmp_path / "ck" / "shard-1-of-3" / "dead-letter"
