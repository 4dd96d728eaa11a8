"""``checkpoint.dir=s3://...``: parsed at startup, with a local copy, bad values named."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiostream_ckpt.daemon.config import load_config
from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.objectstore import ObjectLocation


def test_s3_checkpoint_dir_has_a_location_and_a_local_copy() -> None:
    job = load_config(sets=["checkpoint.dir=s3://my-bucket/jobs/pv/"]).job
    assert job.checkpoint.remote == ObjectLocation("my-bucket", "jobs/pv")
    assert job.checkpoint.directory is not None
    assert job.checkpoint.directory.parts[-3:] == ("my-bucket", "jobs", "pv")


def test_local_dir_places_the_copy(tmp_path: Path) -> None:
    job = load_config(
        sets=["checkpoint.dir=s3://my-bucket/p", f"checkpoint.local_dir={tmp_path}"]
    ).job
    assert job.checkpoint.directory == tmp_path
    assert job.local_state_root() == tmp_path / "local-state"


def test_a_local_checkpoint_dir_has_no_remote(tmp_path: Path) -> None:
    job = load_config(sets=[f"checkpoint.dir={tmp_path}"]).job
    assert job.checkpoint.remote is None and job.checkpoint.directory == tmp_path


def test_local_dir_without_an_object_store_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"checkpoint\.local_dir"):
        load_config(sets=[f"checkpoint.dir={tmp_path}", f"checkpoint.local_dir={tmp_path}"])


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("s3://", "not an S3 bucket name"),
        ("s3://Upper/p", "not an S3 bucket name"),
        ("s3://bucket/a//b", "path segment"),
        ("s3://bucket/../b", "path segment"),
    ],
)
def test_bad_locations_are_named(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        load_config(sets=[f"checkpoint.dir={url}"])


def test_s3_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match=r"s3\.max_attempts"):
        load_config(sets=["checkpoint.dir=s3://bkt/p", "s3.max_attempts=0"])
    with pytest.raises(ConfigError, match=r"s3\.addressing_style"):
        load_config(sets=["checkpoint.dir=s3://bkt/p", "s3.addressing_style=sideways"])
    job = load_config(
        sets=["s3.endpoint_url=http://127.0.0.1:9000", "s3.addressing_style=path"]
    ).job
    assert job.s3.endpoint_url == "http://127.0.0.1:9000" and job.s3.addressing_style == "path"


def test_location_keys_round_trip() -> None:
    loc = ObjectLocation.parse("s3://bkt/a/b")
    assert loc.key("_chain") == "a/b/_chain"
    assert loc.relative("a/b/shared/x") == "shared/x"
    assert ObjectLocation.parse("s3://bkt").key("_chain") == "_chain"
    assert str(loc.child("shard-1")) == "s3://bkt/a/b/shard-1"


def test_a_shard_has_its_own_chain_under_the_prefix(tmp_path: Path) -> None:
    job = load_config(
        sets=[
            "checkpoint.dir=s3://bkt/jobs/pv",
            f"checkpoint.local_dir={tmp_path}",
            "job.shard=1/2",
        ]
    ).job
    assert job.checkpoint_location() == ObjectLocation("bkt", "jobs/pv/shard-1-of-2")
    assert job.checkpoint_dir() == tmp_path / "shard-1-of-2"
    whole = load_config(sets=["checkpoint.dir=s3://bkt/jobs/pv"]).job
    assert whole.checkpoint_location() == ObjectLocation("bkt", "jobs/pv")
