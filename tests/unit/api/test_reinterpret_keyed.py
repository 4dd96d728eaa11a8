"""reinterpret_as_keyed: a keyed operator fed by key-grouped input without a shuffle."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from aiostream_ckpt.connectors.key_grouped import file_key_groups, write_key_grouped
from aiostream_ckpt.errors import JobGraphError, PartitioningError
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.jobspec.graph import Partitioning
from aiostream_ckpt.keygroups import key_group_of
from aiostream_ckpt.runtime.graph import plan_chains
from aiostream_ckpt.runtime.network.placement import graph_fingerprint
from apps.pv_count import CountPageViews, app_id
from tests.helpers import check_pv_output, recount

EVENTS = [{"app_id": f"app-{(i * 7919) % 97}", "seq": i} for i in range(5_000)]


def _input(tmp_path: Path, parts: int = 2) -> list[Path]:
    return write_key_grouped(EVENTS, app_id, tmp_path / "in", parts=parts)


def _env(files: list[Path], out: Path, *, reinterpret: bool, parallelism: int = 2) -> Any:
    config = JobConfig(parallelism=parallelism, batch_size=256)
    config = config.with_checkpoint_dir(out.parent / f"{out.name}-ckpt")
    env = StreamEnvironment("pv", config=config)
    src = JsonLinesFileSource([str(f) for f in files], key_grouped=reinterpret)
    events = env.from_source(src, uid="events")
    keyed = events.reinterpret_as_keyed(app_id) if reinterpret else events.key_by(app_id)
    keyed.process(CountPageViews(), uid="pv-count").sink_to(ExactlyOnceFileSink(out), uid="pv-sink")
    return env


def test_writer_puts_each_key_in_the_file_of_its_key_groups(tmp_path: Path) -> None:
    files = _input(tmp_path, parts=4)
    assert [f.name for f in files][:2] == [
        "kg-00000-00031-of-128.jsonl",
        "kg-00032-00063-of-128.jsonl",
    ]
    total = 0
    for f in files:
        kgs, maxp = file_key_groups(str(f))
        for line in f.read_bytes().splitlines():
            total += 1
            assert key_group_of(orjson.loads(line)["app_id"], maxp) in kgs
    assert total == len(EVENTS)


def test_plan_chains_the_keyed_operator_to_the_source_without_a_keyed_edge(
    tmp_path: Path,
) -> None:
    files = _input(tmp_path)
    co = _env(files, tmp_path / "a", reinterpret=True)
    shuffled = _env(files, tmp_path / "b", reinterpret=False)
    chains = plan_chains(co.spec().transformations, co.config)
    assert [[t.uid for t in c.nodes] for c in chains] == [["events", "pv-count", "pv-sink"]]
    assert not [e for c in chains for e in c.inputs + c.outputs]
    by_uid = {t.uid: t for t in co.spec().transformations}
    assert by_uid["pv-count"].partitioning is Partitioning.FORWARD_KEYED
    # the key_by job: a hash edge between two tasks
    chains = plan_chains(shuffled.spec().transformations, shuffled.config)
    assert [e.partitioning for c in chains for e in c.inputs] == [Partitioning.HASH]
    assert graph_fingerprint(co.spec().transformations) != graph_fingerprint(
        shuffled.spec().transformations
    )


def test_output_at_parallelism_2_equals_the_key_by_path(tmp_path: Path) -> None:
    files = _input(tmp_path)
    _env(files, tmp_path / "co", reinterpret=True).execute()
    _env(files, tmp_path / "hash", reinterpret=False).execute()
    from aiostream_ckpt.connectors.staging import read_committed_output

    def per_key(d: Path) -> dict[str, list[int]]:
        out: dict[str, list[int]] = collections.defaultdict(list)
        for rec in read_committed_output(d):
            out[rec["app_id"]].append(rec["pv"])
        return out

    assert per_key(tmp_path / "co") == per_key(tmp_path / "hash")
    check = check_pv_output(tmp_path / "co", recount(*files))
    assert check.exact and check.records == len(EVENTS)
    # both subtasks read a file: the work was spread, not all in subtask 0
    assert {p.name.rsplit("-", 1)[1] for p in (tmp_path / "co").glob("part-*")} == {
        "0000.jsonl",
        "0001.jsonl",
    }


def test_misdeclared_input_fails_naming_key_group_and_file_before_state(tmp_path: Path) -> None:
    files = _input(tmp_path)
    # swap the names: each file now claims the other half's key groups
    low, high = files
    tmp = low.with_name("swap")
    low.rename(tmp)
    high.rename(low)
    tmp.rename(high)
    env = _env(files, tmp_path / "out", reinterpret=True)
    with pytest.raises(Exception) as info:
        env.execute()
    text = _chain_text(info.value)
    assert "PartitioningError" in text or isinstance(info.value, PartitioningError)
    assert "key group" in text and "kg-000" in text and "pv-count" in text
    assert "'app-" in text  # the key
    # nothing was committed: the first record of each file was refused before state
    assert not list((tmp_path / "out").glob("part-*"))


def test_a_parallelism_that_splits_a_file_is_refused_with_the_ones_that_work(
    tmp_path: Path,
) -> None:
    src = JsonLinesFileSource([str(f) for f in _input(tmp_path)], key_grouped=True)
    with pytest.raises(PartitioningError, match=r"subtasks 0-1 of parallelism 4.*1, 2\b"):
        src.create_reader(ConnectorContext("pv", "events", 0, 4))
    # a divisor works: parallelism 1 reads both files in subtask 0
    assert src.create_reader(
        ConnectorContext("pv", "events", 0, 1)
    ).snapshot_position() == dict.fromkeys(src.splits, 0)
    with pytest.raises(PartitioningError, match=r"job\.max_parallelism=64"):
        src.create_reader(ConnectorContext("pv", "events", 0, 2, max_parallelism=64))


def test_reinterpreted_operator_needs_the_input_parallelism(tmp_path: Path) -> None:
    env = StreamEnvironment("p", config=JobConfig(parallelism=2))
    events = env.from_collection([{"app_id": "a"}])
    events.reinterpret_as_keyed(app_id).process(CountPageViews(), uid="c").print()
    with pytest.raises(JobGraphError, match="reinterpret_as_keyed, so it needs"):
        plan_chains(env.spec().transformations, env.config)


def _chain_text(exc: BaseException) -> str:
    parts = []
    seen: BaseException | None = exc
    while seen is not None:
        parts.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)
