"""Merging every shard's savepoint into one restore point (``checkpoint.rescale``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.checkpoint.rescale import (
    merge_shard_savepoints,
    savepoint_shard,
    write_rescale_point,
)
from aiostream_ckpt.checkpoint.storage import read_checkpoint
from aiostream_ckpt.errors import CheckpointError, RestoreRefusedError
from aiostream_ckpt.keygroups import KeyGroupRange, Shard


def _keyed(sub: int, gp: int) -> dict[str, Any]:
    r = KeyGroupRange.for_operator(sub, gp, 128)
    path = f"pv-{sub}/full-{sub}.lmdb"
    return {
        "keyed": {
            "key_group_range": r.to_json(),
            "chain": [{"path": path, "kind": "full", "size": 1, "sha256": "x"}],
            "files": [path],
        },
        "operator": None,
    }


def _savepoint(root: Path, shard: Shard, p: int, checkpoint_id: int) -> CompletedCheckpoint:
    gp = shard.parallelism(p)
    subs = [shard.subtask(i, p) for i in range(p)]
    directory = root / f"sp-{shard.dirname}"
    return CompletedCheckpoint(
        checkpoint_id=checkpoint_id,
        is_savepoint=True,
        job_name="pv",
        trigger_time=1.0,
        completion_time=2.0,
        duration_seconds=0.5,
        max_parallelism=128,
        operators={
            "events": {
                "parallelism": gp,
                "subtasks": {str(s): {"operator": {"positions": {f"t:{s}": 5}}} for s in subs},
            },
            "pv-count": {"parallelism": gp, "subtasks": {str(s): _keyed(s, gp) for s in subs}},
        },
        tasks={f"events-{i}": {"size_bytes": 1} for i in range(p)},
        size_bytes=10,
        directory=directory,
        root=directory,
    )


@pytest.mark.parametrize(("n", "p"), [(1, 1), (1, 3), (2, 1), (2, 2), (3, 2)])
def test_a_savepoint_says_which_shard_it_holds(tmp_path: Path, n: int, p: int) -> None:
    for i in range(n):
        assert savepoint_shard(_savepoint(tmp_path, Shard(i, n), p, 4)) == Shard(i, n)


def test_the_merged_point_holds_every_subtask_with_paths_from_its_directory(
    tmp_path: Path,
) -> None:
    points = [_savepoint(tmp_path, Shard(i, 2), 2, 10 + i) for i in (1, 0)]
    out = tmp_path / "rescale"
    merged = merge_shard_savepoints(points, out)
    assert merged.checkpoint_id == 11 and merged.is_savepoint
    assert merged.operators["pv-count"]["parallelism"] == 4
    assert sorted(merged.operators["pv-count"]["subtasks"]) == ["0", "1", "2", "3"]
    handle = merged.operators["pv-count"]["subtasks"]["3"]["keyed"]
    assert handle["chain"][0]["path"] == "../sp-shard-1-of-2/pv-3/full-3.lmdb"
    assert handle["files"] == ["../sp-shard-1-of-2/pv-3/full-3.lmdb"]
    assert (out / handle["files"][0]).resolve() == tmp_path / "sp-shard-1-of-2/pv-3/full-3.lmdb"
    positions = {
        k: v
        for st in merged.subtask_states("events").values()
        for k, v in st["operator"]["positions"].items()
    }
    assert positions == {f"t:{s}": 5 for s in range(4)}
    assert sorted(merged.tasks)[:2] == ["shard-0-of-2/events-0", "shard-0-of-2/events-1"]
    # written and read back as any savepoint: the root is its own directory
    write_rescale_point(merged)
    back = read_checkpoint(out)
    assert back.root == out and back.operators == merged.operators
    with pytest.raises(CheckpointError, match="already exists"):
        write_rescale_point(merged)
    # one old shard of one: a rescale from an unsharded job
    whole = merge_shard_savepoints([_savepoint(tmp_path, Shard(0, 1), 2, 3)], tmp_path / "w")
    assert sorted(whole.operators["pv-count"]["subtasks"]) == ["0", "1"]


def test_a_partial_set_is_refused_naming_the_missing_key_groups(tmp_path: Path) -> None:
    points = [_savepoint(tmp_path, Shard(i, 4), 1, 5) for i in (0, 2)]
    with pytest.raises(RestoreRefusedError) as info:
        merge_shard_savepoints(points, tmp_path / "r")
    text = str(info.value)
    assert "the savepoints are of 2 of the 4 shards of job 'pv'" in text, text
    assert "missing shard 1/4: key groups 32-63, shard 3/4: key groups 96-127 of 128" in text


def test_savepoints_that_do_not_belong_together_are_refused(tmp_path: Path) -> None:
    a, b = (_savepoint(tmp_path, Shard(i, 2), 1, 5) for i in (0, 1))
    with pytest.raises(CheckpointError, match="shard 0/2 is given twice"):
        merge_shard_savepoints([a, a], tmp_path / "r")
    other_job = dataclasses.replace(b, job_name="other")
    with pytest.raises(CheckpointError, match="savepoints of different jobs"):
        merge_shard_savepoints([a, other_job], tmp_path / "r")
    three = _savepoint(tmp_path, Shard(1, 3), 1, 5)
    with pytest.raises(CheckpointError, match=r"different shard layouts \(2, 3 shards\)"):
        merge_shard_savepoints([a, three], tmp_path / "r")
    torn = dataclasses.replace(
        b, operators={**b.operators, "pv-count": {"parallelism": 2, "subtasks": {}}}
    )
    with pytest.raises(CheckpointError, match="which is not one shard's"):
        merge_shard_savepoints([a, torn], tmp_path / "r")
    assert not (tmp_path / "r").exists()
