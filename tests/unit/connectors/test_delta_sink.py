"""The Delta sink's writer and committer, driven through the checkpoint cycle by hand.

A state goes through JSON as the checkpoint metadata carries it; a "crash"
is a writer and committer dropped without their commit or notification.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypedDict

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.delta import DeltaSink
from aiostream_ckpt.connectors.delta.committer import DeltaCommitter
from aiostream_ckpt.connectors.delta.writer import DeltaWriter
from aiostream_ckpt.errors import ConfigError, ConnectorError

APP_ID = "job/sink"


class Count(TypedDict):
    app_id: str
    pv: int


def ctx(subtask: int = 0, parallelism: int = 1) -> ConnectorContext:
    return ConnectorContext("job", "sink", subtask, parallelism)


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    return orjson.loads(orjson.dumps(state))  # type: ignore[no-any-return]


async def start(
    sink: DeltaSink,
    states: dict[int, dict[str, Any]] | None = None,
    cid: int | None = None,
    parallelism: int = 1,
) -> tuple[DeltaCommitter, list[DeltaWriter]]:
    """Recover as the job does: the committer first, then every writer."""
    committer = sink.create_committer(ctx(0, parallelism))
    await committer.recover(states or {}, cid)
    writers = []
    for i in range(parallelism):
        w = sink.create_writer(ctx(i, parallelism))
        await w.recover((states or {}).get(i), cid)
        writers.append(w)
    return committer, writers


def rows(path: Path) -> list[dict[str, Any]]:
    table = DeltaTable(str(path)).to_pyarrow_table()
    return sorted(pa.table(table).to_pylist(), key=lambda r: (r["app_id"], r["pv"]))


def version(path: Path) -> int:
    return int(DeltaTable(str(path)).transaction_version(APP_ID) or 0)


def data_files(path: Path) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, f), path)
        for d, _, fs in os.walk(path)
        for f in fs
        if f.endswith(".parquet")
    )


def recs(*pairs: tuple[str, int]) -> list[dict[str, Any]]:
    return [{"app_id": a, "pv": n} for a, n in pairs]


async def test_files_are_outside_the_table_until_one_commit_adds_them(tmp_path: Path) -> None:
    t = tmp_path / "t"
    sink = DeltaSink(t, schema=Count)
    committer, (w,) = await start(sink)
    assert rows(t) == []  # a declared schema: the empty table exists at once
    await w.write(recs(("a", 1), ("b", 1)))
    state = roundtrip(await w.prepare_commit(1))
    assert len(data_files(t)) == 1 and rows(t) == []  # written, in no commit
    await committer.commit(1, {0: state})
    await w.commit(1)
    assert rows(t) == recs(("a", 1), ("b", 1)) and version(t) == 1
    await committer.commit(1, {0: state})  # repeated after a crash: recognised, skipped
    assert rows(t) == recs(("a", 1), ("b", 1))
    assert DeltaTable(str(t)).version() == 1
    assert (await w.prepare_commit(2))["files"] == []  # the writer forgot what 1 committed


async def test_an_aborted_checkpoints_files_ride_with_the_next(tmp_path: Path) -> None:
    t = tmp_path / "t"
    sink = DeltaSink(t, schema=Count)
    committer, (w,) = await start(sink)
    await w.write(recs(("a", 1)))
    await w.prepare_commit(1)  # checkpoint 1 is aborted: never committed
    await w.write(recs(("a", 2)))
    state = roundtrip(await w.prepare_commit(2))
    assert [c for c, _ in state["files"]] == [1, 2]
    await committer.commit(2, {0: state})
    assert rows(t) == recs(("a", 1), ("a", 2)) and version(t) == 2


async def test_one_commit_for_all_subtasks(tmp_path: Path) -> None:
    t = tmp_path / "t"
    sink = DeltaSink(t, schema=Count)
    committer, writers = await start(sink, parallelism=2)
    for i, w in enumerate(writers):
        await w.write(recs((f"k{i}", 1)))
    states = {i: roundtrip(await w.prepare_commit(1)) for i, w in enumerate(writers)}
    await committer.commit(1, states)
    table = DeltaTable(str(t))
    assert table.version() == 1 and len(table.file_uris()) == 2  # create, then one commit
    assert rows(t) == recs(("k0", 1), ("k1", 1))


async def test_recovery_commits_a_completed_checkpoint_once_and_drops_unfinished_ones(
    tmp_path: Path,
) -> None:
    t = tmp_path / "t"
    sink = DeltaSink(t, schema=Count, row_group_size=1)  # a row group per write: files open
    _, (w,) = await start(sink)
    await w.write(recs(("a", 1)))
    s1 = roundtrip(await w.prepare_commit(1))
    await w.write(recs(("a", 2)))
    await w.prepare_commit(2)  # its barrier passed, it never completed
    await w.write(recs(("a", 3)))  # an open data file when the process dies
    assert rows(t) == []  # died after 1's metadata was durable, before its commit
    assert sum(1 for f in os.listdir(t) if f.startswith(".inprogress")) == 1

    committer2, _ = await start(sink, {0: s1}, 1)
    assert rows(t) == recs(("a", 1)) and version(t) == 1
    assert data_files(t) == [s1["files"][0][1]["path"]]  # 2's file and the open one: gone
    assert not [f for f in os.listdir(t) if f.startswith(".inprogress")]
    # a crash right after that commit, before the tasks heard: recovered again, no duplicate
    await start(sink, {0: s1}, 1)
    assert rows(t) == recs(("a", 1)) and DeltaTable(str(t)).version() == 1
    survey = committer2.survey({0: s1}, 1)
    assert survey.lost == [] and survey.retract == [] and survey.highest_id == 1


async def test_a_restore_to_before_the_table_version_retracts_newer_output(
    tmp_path: Path,
) -> None:
    t = tmp_path / "t"
    sink = DeltaSink(t, schema=Count)
    committer, (w,) = await start(sink)
    states = {}
    for cid in (1, 2, 3):
        await w.write(recs(("a", cid)))
        states[cid] = roundtrip(await w.prepare_commit(cid))
        await committer.commit(cid, {0: states[cid]})
        await w.commit(cid)
    survey = committer.survey({0: states[1]}, 1)
    assert [n for _, n in survey.retract] == [1, 1] and survey.highest_id == 3
    before = data_files(t)
    await start(sink, {0: states[1]}, 1)
    assert rows(t) == recs(("a", 1))  # the table's newest version: up to checkpoint 1
    assert data_files(t) == before  # removed by a commit, not deleted: time travel reads them
    old = DeltaTable(str(t), version=3).to_pyarrow_table()
    assert pa.table(old).num_rows == 3


async def test_a_fresh_start_on_a_table_holding_this_sinks_output_is_surveyed_as_kept(
    tmp_path: Path,
) -> None:
    t = tmp_path / "t"
    sink = DeltaSink(t, schema=Count)
    committer, (w,) = await start(sink)
    await w.write(recs(("a", 1)))
    await committer.commit(1, {0: roundtrip(await w.prepare_commit(1))})
    fresh = sink.create_committer(ctx())
    survey = fresh.survey({}, None)
    assert "holds the output of checkpoints up to 1" in survey.kept
    assert survey.highest_id == 1  # new checkpoint ids start above it


async def test_a_table_with_a_conflicting_schema_is_refused_at_start(tmp_path: Path) -> None:
    t = tmp_path / "t"
    write_deltalake(str(t), pa.table({"app_id": ["x"], "pv": ["not a number"]}))
    with pytest.raises(ConnectorError, match=r"has the schema \{app_id: string, pv: string\}"):
        await start(DeltaSink(t, schema=Count))
    assert pa.table(DeltaTable(str(t)).to_pyarrow_table()).num_rows == 1  # untouched
    u = tmp_path / "u"
    write_deltalake(str(u), pa.table({"app_id": ["x"], "pv": [1]}), partition_by=["app_id"])
    with pytest.raises(ConnectorError, match=r"partitioned by \['app_id'\], the sink by nothing"):
        await start(DeltaSink(u, schema=pa.schema([("app_id", pa.string()), ("pv", pa.int64())])))


async def test_another_writers_table_with_the_same_columns_is_appended_to(tmp_path: Path) -> None:
    t = tmp_path / "t"
    write_deltalake(str(t), pa.table({"app_id": ["x"], "pv": [7]}))
    committer, (w,) = await start(DeltaSink(t))  # inferred: the table's schema is enforced
    failed: list[Any] = []
    w.record_failed = lambda fn, rec, exc: failed.append((rec, str(exc)))
    await w.write([*recs(("a", 1)), {"app_id": "b", "pv": "one"}, {"app_id": "c", "n": 1}])
    await committer.commit(1, {0: roundtrip(await w.prepare_commit(1))})
    assert rows(t) == recs(("a", 1), ("x", 7))
    assert [r for r, _ in failed] == [{"app_id": "b", "pv": "one"}, {"app_id": "c", "n": 1}]
    assert "field 'pv' is string, not int64" in failed[0][1]
    assert "field(s) n not in the schema" in failed[1][1]


async def test_partitions_and_target_file_size(tmp_path: Path) -> None:
    t = tmp_path / "t"
    schema = pa.schema([("app_id", pa.string()), ("pv", pa.int64())])
    sink = DeltaSink(
        t, schema=schema, partition_by=["app_id"], target_file_size=1, row_group_size=2
    )
    committer, (w,) = await start(sink)
    await w.write(recs(("a b/c", 1), ("a b/c", 2)))  # a row group: the file is past its target
    await w.write([*recs(("a b/c", 3), ("z", 1)), {"pv": 9}])
    await committer.commit(1, {0: roundtrip(await w.prepare_commit(1))})
    files = data_files(t)
    assert {os.path.dirname(f) for f in files} == {
        "app_id=a%20b%2Fc",
        "app_id=z",
        "app_id=__HIVE_DEFAULT_PARTITION__",
    }
    assert len(files) == 4  # "a b/c" went on in a new file after its first row group
    got = pa.table(DeltaTable(str(t)).to_pyarrow_table()).to_pylist()
    assert sorted(got, key=lambda r: (r["app_id"] or "", r["pv"])) == [
        {"app_id": None, "pv": 9},
        *recs(("a b/c", 1), ("a b/c", 2), ("a b/c", 3), ("z", 1)),
    ]


async def test_inferred_schema_creates_the_table_at_the_first_commit(tmp_path: Path) -> None:
    t = tmp_path / "t"
    sink = DeltaSink(t)
    committer, writers = await start(sink, parallelism=2)
    assert not (t / "_delta_log").exists()
    await writers[0].write([{"k": "a", "n": 1}])
    await writers[1].write([{"k": "b", "n": 1.5}])  # a float: another schema
    states = {i: roundtrip(await w.prepare_commit(1)) for i, w in enumerate(writers)}
    with pytest.raises(ConnectorError, match=r"inferred different schemas.*declare the schema"):
        await committer.commit(1, states)
    await committer.commit(1, {0: states[0]})
    assert pa.table(DeltaTable(str(t)).to_pyarrow_table()).to_pylist() == [{"k": "a", "n": 1}]


async def test_optimize_and_vacuum_keep_every_record_once(tmp_path: Path) -> None:
    t = tmp_path / "t"
    sink = DeltaSink(t, schema=Count, optimize_every=3, vacuum_retention_hours=0)
    committer, (w,) = await start(sink)
    for cid in range(1, 7):
        await w.write(recs(("a", cid)))
        await committer.commit(cid, {0: roundtrip(await w.prepare_commit(cid))})
        await w.commit(cid)
    assert rows(t) == recs(*[("a", n) for n in range(1, 7)])
    table = DeltaTable(str(t))
    assert len(table.file_uris()) == 1  # compacted after 6
    assert [h["operation"] for h in table.history()].count("OPTIMIZE") == 2
    assert len(data_files(t)) == 1  # the compacted-away files were vacuumed
    survey = sink.create_committer(ctx()).survey({}, 2)
    assert "compaction may have merged" in survey.kept


def test_bad_configurations_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"partition columns \['day'\] not in schema"):
        DeltaSink(tmp_path, schema=Count, partition_by=["day"])
    with pytest.raises(ConfigError, match="vacuum_retention_hours needs optimize_every"):
        DeltaSink(tmp_path, vacuum_retention_hours=1)
    with pytest.raises(ConfigError, match="every column is a partition column"):
        DeltaSink(tmp_path, schema=Count, partition_by=["app_id", "pv"])
