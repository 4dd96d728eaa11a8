"""``aiostream-ckpt rescale``: finding every shard's stop-with-savepoint in checkpoint.dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint, encode_metadata
from aiostream_ckpt.checkpoint.rescale import write_rescale_point
from aiostream_ckpt.checkpoint.storage import CheckpointStorage
from aiostream_ckpt.daemon.rescale import stopped_shards
from aiostream_ckpt.errors import ConfigError, RestoreRefusedError
from aiostream_ckpt.keygroups import WHOLE_JOB, Shard


def _stopped(root: Path, shard: Shard, checkpoint_id: int) -> Path:
    """Leave a stop-with-savepoint of ``shard`` in its directory, as ``savepoint stop`` does."""
    chain = root / shard.dirname if shard.sharded else root
    sp = chain / "savepoints" / f"sp-{checkpoint_id}"
    write_rescale_point(
        CompletedCheckpoint(
            checkpoint_id=checkpoint_id,
            is_savepoint=True,
            job_name="pv",
            trigger_time=0.0,
            completion_time=0.0,
            duration_seconds=0.0,
            max_parallelism=128,
            operators={
                "events": {
                    "parallelism": shard.count,
                    "subtasks": {str(shard.index): {"operator": None}},
                }
            },
            tasks={},
            size_bytes=0,
            directory=sp,
            root=sp,
        )
    )
    CheckpointStorage(chain).record_stop_savepoint(sp, checkpoint_id)
    return sp


def test_every_shards_stop_savepoint_is_found(tmp_path: Path) -> None:
    sps = [_stopped(tmp_path, Shard(i, 2), 10 + i) for i in (0, 1)]
    assert [p.directory for p in stopped_shards(tmp_path)] == sps


def test_an_unsharded_job_is_one_shard_of_one(tmp_path: Path) -> None:
    sp = _stopped(tmp_path, WHOLE_JOB, 4)
    assert [p.directory for p in stopped_shards(tmp_path)] == [sp]


def test_a_shard_without_a_stop_savepoint_is_named_with_its_key_groups(tmp_path: Path) -> None:
    _stopped(tmp_path, Shard(0, 2), 10)
    (tmp_path / "shard-1-of-2").mkdir()
    with pytest.raises(RestoreRefusedError) as info:
        stopped_shards(tmp_path)
    text = str(info.value)
    assert "shard 1/2 (key groups 64-127 of 128) has no stop-with-savepoint in" in text, text


def test_a_shard_that_ran_on_after_its_savepoint_is_refused(tmp_path: Path) -> None:
    for i in (0, 1):
        _stopped(tmp_path, Shard(i, 2), 10)
    (tmp_path / "shard-1-of-2" / "chk-0000000012" / "_metadata").parent.mkdir()
    # a completed checkpoint newer than the savepoint (its metadata is what counts)
    (tmp_path / "shard-1-of-2" / "chk-0000000012" / "_metadata").write_bytes(encode_metadata({}))
    with pytest.raises(RestoreRefusedError, match=r"shard 1/2 .* ran on after its stop-with"):
        stopped_shards(tmp_path)


def test_several_stopped_layouts_need_to_be_told_apart(tmp_path: Path) -> None:
    for i in (0, 1):
        _stopped(tmp_path, Shard(i, 2), 10)
    for i in range(4):
        _stopped(tmp_path, Shard(i, 4), 20)
    with pytest.raises(ConfigError, match=r"several layouts \(2, 4 shards\).*--from-shards"):
        stopped_shards(tmp_path)
    assert len(stopped_shards(tmp_path, 4)) == 4
    with pytest.raises(ConfigError, match="no shards of a layout of 3"):
        stopped_shards(tmp_path, 3)
    with pytest.raises(RestoreRefusedError, match=r"no shard in .* was stopped"):
        stopped_shards(tmp_path / "empty")
