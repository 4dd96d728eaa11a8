"""A checkpoint directory holds one shard layout; a fresh start beside another is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.keygroups import WHOLE_JOB, Shard
from aiostream_ckpt.runtime.failover.shard_layout import check_shard_layout, other_layouts


def _ran(root: Path, shard: Shard) -> None:
    """Leave a checkpoint id behind in ``shard``'s directory, as a run would."""
    config = JobConfig(shard=shard).with_checkpoint_dir(root)
    own = config.checkpoint_dir()
    assert own is not None
    (own / "chk-0000000003").mkdir(parents=True)


def _config(root: Path, shard: Shard, restore_from: Path | None = None) -> JobConfig:
    return JobConfig(shard=shard, restore_from=restore_from).with_checkpoint_dir(root)


def test_a_fresh_shard_beside_another_layout_is_refused_naming_it(tmp_path: Path) -> None:
    _ran(tmp_path, Shard(0, 2))
    _ran(tmp_path, Shard(1, 2))
    check_shard_layout(_config(tmp_path, Shard(1, 2)))  # its own layout: fine
    with pytest.raises(ConfigError) as info:
        check_shard_layout(_config(tmp_path, Shard(0, 3)))
    text = str(info.value)
    assert "2 shards: shard-0-of-2, shard-1-of-2" in text and "shard 0/3 has none" in text
    assert "rescale through savepoints" in text
    with pytest.raises(ConfigError, match=r"the whole job \(no --shard\) has none"):
        check_shard_layout(_config(tmp_path, WHOLE_JOB))


def test_shards_beside_an_unsharded_run_are_refused(tmp_path: Path) -> None:
    _ran(tmp_path, WHOLE_JOB)
    assert other_layouts(tmp_path, Shard(0, 2)) == {"unsharded": [str(tmp_path)]}
    with pytest.raises(ConfigError, match="unsharded"):
        check_shard_layout(_config(tmp_path, Shard(0, 2)))


def test_a_restore_point_or_own_checkpoints_let_it_start(tmp_path: Path) -> None:
    _ran(tmp_path, Shard(0, 2))
    check_shard_layout(_config(tmp_path, Shard(0, 3), restore_from=tmp_path / "sp"))
    _ran(tmp_path, Shard(0, 3))  # once it has checkpoints of its own it resumes from them
    check_shard_layout(_config(tmp_path, Shard(0, 3)))
    # empty shard directories (a start refused before any checkpoint) count for nothing
    (tmp_path / "shard-4-of-5").mkdir()
    assert "5 shards" not in other_layouts(tmp_path, Shard(1, 3))
