from pathlib import Path

from bench.systems import completed_from_lines
from bench.validation import check_pv_records, python_recount


def test_exact_output_passes() -> None:
    recs = [{"app_id": "a", "pv": 1}, {"app_id": "b", "pv": 1}, {"app_id": "a", "pv": 2}]
    v = check_pv_records(recs, {"a": 2, "b": 1})
    assert v.passed and v.summary == "exactly-once"


def test_duplicate_missing_and_unexpected_fail() -> None:
    assert not check_pv_records([{"app_id": "a", "pv": 1}] * 2, {"a": 1}).passed
    v = check_pv_records([{"app_id": "a", "pv": 1}], {"a": 2})
    assert not v.passed and v.counts["missing_keys"] == 1
    v = check_pv_records([{"app_id": "a", "pv": 2}], {"a": 2})
    assert not v.passed and v.counts["gaps"] == 1
    v = check_pv_records([{"app_id": "zz", "pv": 1}], {"a": 0})
    assert not v.passed and v.counts["unexpected"] == 1


def test_recount_reads_committed_files_only(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"app_id":"a"}\n{"app_id":"a"}\n')
    out = tmp_path / "out"
    out.mkdir()
    (out / "part-0000000001-0000.jsonl").write_text('{"app_id":"a","pv":1}\n')
    (out / ".part-0000-0000000002.pending").write_text('{"app_id":"a","pv":2}\n')
    assert not python_recount(inp, out).passed
    (out / "part-0000000002-0000.jsonl").write_text('{"app_id":"a","pv":2}\n')
    assert python_recount(inp, out).passed


def test_checkpoint_log_lines_parse() -> None:
    lines = [(0.5, "x"), (1.0, "INFO coordinator: checkpoint 7 completed in 12 ms (100 bytes)")]
    assert completed_from_lines(lines) == [(1.0, 7, 12.0, 100)]
