"""The Delta sink's bad input, as a job meets it: a record that does not fit, a foreign table."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.helpers import cli

pytestmark = pytest.mark.integration

APP = """
from typing import TypedDict

from aiostream_ckpt.connectors.delta import DeltaSink
from aiostream_ckpt.connectors.files import JsonLinesFileSource


class Count(TypedDict):
    app_id: str
    pv: int


def build(env):
    p = env.params
    events = env.from_source(JsonLinesFileSource(p["input"]), uid="events")
    events.sink_to(DeltaSink(p["output"], schema=Count), uid="table")
"""


def _run(tmp_path: Path, lines: list[object], *sets: str) -> tuple[int, str, Path]:
    app = tmp_path / "app.py"
    app.write_text(APP)
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    table = tmp_path / "table"
    args = [f"app.input={inp}", f"app.output={table}", f"checkpoint.dir={tmp_path / 'ckpt'}"]
    args += ["rest.port=0", *sets]
    proc = cli("run", str(app), *[a for s in args for a in ("--set", s)], timeout=300)
    return proc.returncode, proc.stderr, table


def test_records_that_do_not_fit_go_to_the_dead_letters_with_the_reason(tmp_path: Path) -> None:
    lines = [
        {"app_id": "a", "pv": 1},
        {"app_id": "b", "pv": "two"},
        {"app_id": "c", "pv": 3, "extra": 1},
        {"app_id": "d", "pv": 4},
    ]
    code, err, table = _run(tmp_path, lines, "errors.on_process_error=dead_letter")
    assert code == 0, err[-3000:]
    rows = pa.table(DeltaTable(str(table)).to_pyarrow_table()).to_pylist()
    assert sorted(r["app_id"] for r in rows) == ["a", "d"]
    dead = [
        json.loads(line)
        # the sink is chained to the source: the chain's dead letters are under its head
        for f in sorted((tmp_path / "ckpt" / "dead-letter" / "events").glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    reasons = {json.loads(d["raw"])["app_id"]: d["reason"] for d in dead}
    assert set(reasons) == {"b", "c"}
    assert {d["origin"]["function"] for d in dead} == {"schema of sink 'delta-sink'"}
    assert "field 'pv' is string, not int64" in reasons["b"]
    assert "field(s) extra not in the schema" in reasons["c"]


def test_a_table_with_a_conflicting_schema_is_refused_at_start(tmp_path: Path) -> None:
    table = tmp_path / "table"
    write_deltalake(str(table), pa.table({"app_id": ["x"], "pv": [1.5]}))
    code, err, _ = _run(tmp_path, [{"app_id": "a", "pv": 1}])
    assert code != 0
    assert "has the schema {app_id: string, pv: double}" in err, err[-2000:]
    assert "declares {app_id: string, pv: int64}" in err
    assert "not restarted" in err or "not retriable" in err, err[-2000:]
    assert pa.table(DeltaTable(str(table)).to_pyarrow_table()).num_rows == 1  # untouched
    assert DeltaTable(str(table)).version() == 0
