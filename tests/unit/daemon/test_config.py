"""Config layering: defaults < TOML < AIOSTREAM_* env < --set; errors name the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aiostream_ckpt.daemon.config import load_config
from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.jobspec.config import CheckpointingMode, RestartStrategyKind


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "job.toml"
    p.write_text(text)
    return p


def test_precedence(tmp_path: Path) -> None:
    toml = write(
        tmp_path,
        '[job]\nparallelism = 2\nname = "x"\n[checkpoint]\ninterval = "5s"\ndir = "/a"\n'
        'mode = "at_least_once"\n[app]\ninput = "f.jsonl"\n',
    )
    env = {"AIOSTREAM_CHECKPOINT__INTERVAL": "2s", "AIOSTREAM_JOB__PARALLELISM": "3"}
    loaded = load_config(toml, env=env, sets=["checkpoint.interval=200ms", "app.output=o"])
    assert loaded.job.parallelism == 3  # env beats TOML
    assert loaded.job.checkpoint.interval == 0.2  # --set beats env
    assert loaded.job.checkpoint.directory == Path("/a")
    assert loaded.job.checkpoint.mode is CheckpointingMode.AT_LEAST_ONCE
    assert loaded.params == {"input": "f.jsonl", "output": "o"}
    assert loaded.job_name == "x"
    assert loaded.sources["checkpoint.interval"] == "--set"


def test_defaults_follow_the_design() -> None:
    job = load_config(None, env={}).job
    assert job.checkpoint.interval == 1.0
    assert job.checkpoint.mode is CheckpointingMode.EXACTLY_ONCE
    assert job.restart.strategy is RestartStrategyKind.FIXED_DELAY


def test_gc_threshold_setting() -> None:
    assert load_config(None, env={}).daemon.gc_threshold == 50_000
    env = {"AIOSTREAM_PROCESS__GC_THRESHOLD": "700"}
    assert load_config(None, env=env).daemon.gc_threshold == 700


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["checkpoint.intervall=1s"], "unknown config key 'checkpoint.intervall'"),
        (["checkpoint.interval=soon"], "invalid config checkpoint.interval='soon'"),
        (["checkpoint.mode=twice"], "one of exactly_once, at_least_once"),
        (["job.parallelism=0"], "invalid config job.parallelism=0"),
        (["job.parallelism=200"], "1..max_parallelism"),
        (["job.parallelism=two"], "job.parallelism='two' (from --set): must be an integer"),
        (["job.batch_size=-5"], "invalid config job.batch_size=-5: must be >= 1"),
        (
            ["checkpoint.max_delta_ratio=lots"],
            "max_delta_ratio='lots' (from --set): must be a number",
        ),
        (["job.workers=0"], "invalid config job.workers=0"),
        (["job.workers=100000"], "the cores this process may run on"),
        (["checkpoint.max_concurrent=0"], "checkpoint.max_concurrent"),
        (["restart.strategy=forever"], "fixed_delay"),
        (["nokey"], "--set expects key=value"),
        (["process.gc_threshold=0"], "invalid config process.gc_threshold='0'"),
        (["checkpoint.max_delta_ratio=-1"], "checkpoint.max_delta_ratio"),
        (["errors.on_process_error=skip"], "one of fail, dead_letter"),
        (["errors.max_process_errors_per_checkpoint=0"], "max_process_errors_per_checkpoint"),
        (["job.shard=2/2"], "job.shard='2/2' (from --set): must be I/N with I in 0..N-1"),
        (["job.shard=1"], "job.shard='1' (from --set): must be I/N: shard I of N shards"),
        (["job.shard=0/200"], "job.shard='0/200': must be at most job.max_parallelism (128)"),
    ],
)
def test_bad_values_name_the_key(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, env={}, sets=sets)


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[job\n"), env={})
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml", env={})


def test_a_shard_from_the_environment() -> None:
    loaded = load_config(None, env={"AIOSTREAM_JOB__SHARD": "1/3"})
    assert (loaded.job.shard.index, loaded.job.shard.count) == (1, 3)
