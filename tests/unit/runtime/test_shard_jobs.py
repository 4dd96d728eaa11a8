"""Sharded jobs in one process: each shard runs the whole job over its key groups.

Shards of 2 over key-grouped files, run one after the other: together they
commit exactly what the unsharded job commits, each into its own shard
directories; a key of another shard fails the job naming that shard
before the record reaches state or output.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from aiostream_ckpt.connectors.key_grouped import write_key_grouped
from aiostream_ckpt.connectors.staging import read_committed_output
from aiostream_ckpt.errors import JobFailedError
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.keygroups import Shard, key_group_of
from aiostream_ckpt.runtime.graph import build_chain_specs, plan_chains
from aiostream_ckpt.runtime.key_group_check import KeyGroupCheck
from apps.pv_count import CountPageViews, app_id
from tests.helpers import check_pv_output, recount

EVENTS = [
    {"app_id": f"app-{(i * 7919) % 97}", "user": f"u{i % 13}", "seq": i} for i in range(4_000)
]


def _env(
    files: list[Path],
    tmp_path: Path,
    shard: Shard,
    *,
    parallelism: int = 1,
    how: str = "reinterpret",
    key: Any = app_id,
) -> StreamEnvironment:
    config = JobConfig(parallelism=parallelism, batch_size=256, shard=shard)
    env = StreamEnvironment("pv", config=config.with_checkpoint_dir(tmp_path / "ckpt"))
    source = JsonLinesFileSource([str(f) for f in files], key_grouped=how != "plain")
    events = env.from_source(source, uid="events")
    keyed = events.reinterpret_as_keyed(key) if how == "reinterpret" else events.key_by(key)
    counts = keyed.process(CountPageViews(), uid="pv-count")
    counts.sink_to(ExactlyOnceFileSink(tmp_path / "out"), uid="pv-sink")
    return env


@pytest.mark.parametrize(
    ("how", "parallelism"), [("reinterpret", 1), ("reinterpret", 2), ("key_by", 1), ("key_by", 2)]
)
def test_two_shards_commit_together_what_the_whole_job_commits(
    tmp_path: Path, how: str, parallelism: int
) -> None:
    files = write_key_grouped(EVENTS, app_id, tmp_path / "in", parts=4)
    for i in (0, 1):
        _env(files, tmp_path, Shard(i, 2), parallelism=parallelism, how=how).execute()
    check = check_pv_output(tmp_path / "out", recount(*files))
    assert check.exact and check.records == len(EVENTS), check.gaps[:3]
    # each shard wrote only its own keys, into its own directory
    for i in (0, 1):
        shard_dir = tmp_path / "out" / f"shard-{i}-of-2"
        keys = {r["app_id"] for r in read_committed_output(shard_dir)}
        assert keys and all(key_group_of(k, 128) in Shard(i, 2).key_groups(128) for k in keys)
        # the job's subtasks across both shards name the files: 2i.. in shard i
        subtasks = {int(p.stem.rsplit("-", 1)[1]) for p in shard_dir.glob("part-*")}
        assert subtasks <= {i * parallelism + s for s in range(parallelism)}, subtasks
        assert (tmp_path / "ckpt" / f"shard-{i}-of-2").is_dir()
    assert not list((tmp_path / "out").glob("part-*"))  # nothing beside the shards


def test_a_key_by_on_another_key_fails_naming_the_shard_before_any_output(
    tmp_path: Path,
) -> None:
    files = write_key_grouped(EVENTS, app_id, tmp_path / "in", parts=4)
    user = lambda e: e["user"]  # noqa: E731 - the key the input is NOT partitioned by
    env = _env(files, tmp_path, Shard(0, 2), parallelism=2, how="key_by", key=user)
    with pytest.raises(JobFailedError) as info:
        env.execute()
    text = str(info.value)
    assert "PartitioningError" in text and "not retriable" in text, text
    assert "this daemon runs shard 0/2 (key groups 0-63 of 128)" in text, text
    assert "which shard 1/2 owns" in text and "Stream.through" in text, text
    assert not list((tmp_path / "out").rglob("part-*"))


def test_a_key_by_chained_at_parallelism_1_checks_the_shard_too(tmp_path: Path) -> None:
    files = write_key_grouped(EVENTS, app_id, tmp_path / "in", parts=2)
    user = lambda e: e["user"]  # noqa: E731
    env = _env(files, tmp_path, Shard(1, 2), how="key_by", key=user)
    chains = plan_chains(env.spec().transformations, env.config)
    assert [[t.uid for t in c.nodes] for c in chains] == [["events", "pv-count", "pv-sink"]]
    with pytest.raises(JobFailedError, match=r"which shard 0/2 owns, but this daemon runs shard"):
        env.execute()
    assert not list((tmp_path / "out").rglob("part-*"))


def test_unsharded_the_chained_key_by_has_no_check(tmp_path: Path) -> None:
    files = write_key_grouped(EVENTS, app_id, tmp_path / "in", parts=2)
    for shard, checked in ((Shard(0, 1), False), (Shard(0, 2), True)):
        spec = _env(files, tmp_path, shard, how="key_by").spec()
        specs = build_chain_specs(
            plan_chains(spec.transformations, spec.config),
            config=spec.config,
            job_name="pv",
            attempt=0,
            backend_factory=lambda **kw: None,
            local_dir=tmp_path / "local",
            dead_letter_factory=None,
            connector_context=lambda uid, sub, p, dl, shard=shard: ConnectorContext(
                "pv", uid, sub, p, shard=shard
            ),
            monotonic=lambda: 0.0,
        )
        ops = [op for chain in specs for op in chain.operators]
        assert any(isinstance(op, KeyGroupCheck) for op in ops) is checked
        assert [(c.subtask, c.parallelism) for c in specs] == [(0, shard.count)]


def test_a_plain_input_is_split_over_shards_and_a_stateless_job_runs(tmp_path: Path) -> None:
    """Files not written by key group: each shard reads a block of them; a map needs no keys."""
    paths = []
    for j in range(4):
        path = tmp_path / "in" / f"part-{j}.jsonl"
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(f'{{"n": {j * 100 + k}}}\n' for k in range(100)))
        paths.append(path)
    seen: list[int] = []
    for i in (0, 1):
        config = JobConfig(shard=Shard(i, 2)).with_checkpoint_dir(tmp_path / "ckpt")
        env = StreamEnvironment("plain", config=config)
        stream = env.from_source(JsonLinesFileSource([str(p) for p in paths]), uid="in")
        got = env.execute_and_collect(stream.map(lambda e: e["n"], uid="n"))
        assert collections.Counter(n // 200 for n in got) == {i: 200}
        seen += got
    assert sorted(seen) == list(range(400))


def test_a_sharded_job_refuses_a_key_by_on_plain_input_before_state(tmp_path: Path) -> None:
    files = write_key_grouped(EVENTS, app_id, tmp_path / "in", parts=4)
    _env(files, tmp_path, Shard(0, 2), parallelism=2, how="key_by").execute()  # passes ...
    plain = []  # ... the same events dealt into files by sequence number do not
    for j in (0, 1):
        path = tmp_path / "plain" / f"events-{j}.jsonl"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in EVENTS[j::2]))
        plain.append(path)
    env = _env(plain, tmp_path / "p", Shard(0, 2), parallelism=2, how="plain")
    with pytest.raises(JobFailedError, match="which shard 1/2 owns"):
        env.execute()
    assert not list((tmp_path / "p" / "out").rglob("part-*"))
