from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypedDict

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aiostream_ckpt.connectors.arrow_records import SchemaMismatch
from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.output_recovery import LOCATION_FILE, RETRACTED_DIR
from aiostream_ckpt.connectors.parquet import (
    ParquetFileSink,
    ParquetStagedWriter,
    committed_parquet_files,
    read_committed_parquet,
)
from aiostream_ckpt.errors import ConfigError, ConnectorError


class Count(TypedDict):
    app_id: str
    count: int
    note: str | None


def ctx(subtask: int = 0, parallelism: int = 1) -> ConnectorContext:
    return ConnectorContext("job", "sink", subtask, parallelism)


async def writer(
    d: Path,
    restored: Any = None,
    cid: int | None = None,
    *,
    schema: Any = Count,
    row_group_size: int = 1000,
    subtask: int = 0,
) -> ParquetStagedWriter:
    sink = ParquetFileSink(d, schema=schema, row_group_size=row_group_size)
    w = sink.create_writer(ctx(subtask))
    await w.recover(restored, cid)
    return w


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    return orjson.loads(orjson.dumps(state))  # type: ignore[no-any-return]


def visible(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if not n.startswith(".") and n != LOCATION_FILE)


async def test_staged_until_complete_then_one_parquet_file_per_checkpoint(tmp_path: Path) -> None:
    w = await writer(tmp_path)
    await w.write([{"app_id": "a", "count": 1}, {"app_id": "b", "count": 2, "note": "x"}])
    state = await w.prepare_commit(1)
    assert visible(tmp_path) == []  # pre-committed: hidden from readers
    assert state["pending"] == [[".part-0000-0000000001.pending", "part-0000000001-0000.parquet"]]
    await w.commit(1)
    assert visible(tmp_path) == ["part-0000000001-0000.parquet"]
    assert list(read_committed_parquet(tmp_path)) == [
        {"app_id": "a", "count": 1, "note": None},
        {"app_id": "b", "count": 2, "note": "x"},
    ]
    table = pq.read_table(tmp_path / "part-0000000001-0000.parquet")
    assert table.schema.field("app_id").type == pa.string()
    assert not table.schema.field("count").nullable
    # a checkpoint without records makes no file; committed files never change
    before = (tmp_path / "part-0000000001-0000.parquet").read_bytes()
    await w.prepare_commit(2)
    await w.commit(2)
    assert visible(tmp_path) == ["part-0000000001-0000.parquet"]
    assert (tmp_path / "part-0000000001-0000.parquet").read_bytes() == before


async def test_row_groups_hold_row_group_size_rows(tmp_path: Path) -> None:
    w = await writer(tmp_path, row_group_size=100)
    for i in range(7):
        await w.write([{"app_id": f"a{i}", "count": j} for j in range(45)])  # 315 rows
    await w.prepare_commit(1)
    await w.commit(1)
    (path,) = committed_parquet_files(tmp_path)
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [100, 100, 100, 15]
    assert len(list(read_committed_parquet(tmp_path))) == 315


async def test_a_record_that_does_not_fit_goes_to_record_failed_with_the_reason(
    tmp_path: Path,
) -> None:
    w = await writer(tmp_path)
    failed: list[tuple[str, Any, str]] = []
    w.record_failed = lambda fn, rec, exc: failed.append((fn, rec, str(exc)))
    await w.write(
        [
            {"app_id": "ok", "count": 1},
            {"app_id": "a", "count": 1.5},  # pyarrow alone would truncate it to 1
            {"app_id": "b", "count": "2"},
            {"app_id": "c", "count": 3, "extra": True},
            {"count": 4},  # app_id is not nullable
            ["not", "a", "mapping"],
            {"app_id": "ok2", "count": 2.0},  # no fraction: fits
        ]
    )
    await w.prepare_commit(1)
    await w.commit(1)
    assert [r["app_id"] for r in read_committed_parquet(tmp_path)] == ["ok", "ok2"]
    reasons = {orjson.dumps(rec).decode(): why for _, rec, why in failed}
    assert len(failed) == 5 and {fn for fn, _, _ in failed} == {"schema of sink 'parquet-sink'"}
    assert "truncated" in reasons['{"app_id":"a","count":1.5}']
    assert "field 'count' is string, not int64" in reasons['{"app_id":"b","count":"2"}']
    assert "extra not in the schema" in reasons['{"app_id":"c","count":3,"extra":true}']
    assert "field 'app_id' is missing or null" in reasons['{"count":4}']
    assert "not a mapping" in reasons['["not","a","mapping"]']


async def test_record_failed_may_raise_the_jobs_error(tmp_path: Path) -> None:
    w = await writer(tmp_path)

    def fail(fn: str, rec: Any, exc: Exception) -> None:
        raise exc

    w.record_failed = fail
    with pytest.raises(SchemaMismatch, match="field 'count' is string"):
        await w.write([{"app_id": "a", "count": "x"}])


async def test_inferred_schema_is_kept_in_the_state_and_enforced_after_restore(
    tmp_path: Path,
) -> None:
    w = await writer(tmp_path, schema=None)
    await w.write([{"k": "a", "n": 1}])
    state = roundtrip(await w.prepare_commit(1))
    await w.commit(1)
    await w.close()
    w2 = await writer(tmp_path, state, 1, schema=None)
    failed: list[Any] = []
    w2.record_failed = lambda fn, rec, exc: failed.append(rec)
    await w2.write([{"k": "b", "n": 2}, {"k": "c", "n": "two"}])
    await w2.prepare_commit(2)
    await w2.commit(2)
    assert failed == [{"k": "c", "n": "two"}]
    assert list(read_committed_parquet(tmp_path)) == [{"k": "a", "n": 1}, {"k": "b", "n": 2}]


async def test_a_field_null_in_the_whole_first_batch_cannot_be_inferred(tmp_path: Path) -> None:
    w = await writer(tmp_path, schema=None)
    with pytest.raises(ConnectorError, match=r"'n' is null in every record.*declare the schema"):
        await w.write([{"k": "a", "n": None}])


async def test_crash_after_pre_commit_is_committed_by_recovery_and_retracted_by_an_older_restore(
    tmp_path: Path,
) -> None:
    w = await writer(tmp_path)
    await w.write([{"app_id": "a", "count": 1}])
    s1 = roundtrip(await w.prepare_commit(1))
    await w.commit(1)
    await w.write([{"app_id": "b", "count": 2}])
    s2 = roundtrip(await w.prepare_commit(2))
    await w.write([{"app_id": "c", "count": 3}])  # open when the process dies
    await w.close()
    assert [r["app_id"] for r in read_committed_parquet(tmp_path)] == ["a"]
    w2 = await writer(tmp_path, s2, 2)  # checkpoint 2 completed: its file is committed
    assert [r["app_id"] for r in read_committed_parquet(tmp_path)] == ["a", "b"]
    await w2.close()
    survey = (await writer(tmp_path, s1, 1)).survey(s1, 1)  # (recovered already: idempotent)
    assert survey.retract == [] and [r["app_id"] for r in read_committed_parquet(tmp_path)] == ["a"]
    (manifest,) = (tmp_path / RETRACTED_DIR).glob("*/_manifest-*.json")
    assert orjson.loads(manifest.read_bytes())["records"] == 1  # counted as Parquet rows


def test_bad_declarations_are_refused_when_the_job_is_built(tmp_path: Path) -> None:
    class Bad(TypedDict):
        when: complex

    with pytest.raises(ConfigError, match=r"Bad.when: <class 'complex'> has no column type"):
        ParquetFileSink(tmp_path, schema=Bad)
    with pytest.raises(ConfigError, match="row_group_size must be positive"):
        ParquetFileSink(tmp_path, row_group_size=0)
