"""pv_count: clean output passes; each corruption fails and names the record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt_dev.validate import CheckResult, pv_count_check, read_file_sink_output

from .conftest import Case, build_case

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def check(spark: Any, case: Case) -> CheckResult:
    return pv_count_check(spark, case.input_paths, read_file_sink_output(spark, case.out_dir))


def failures(result: CheckResult) -> dict[str, int]:
    names = ("duplicates", "missing", "mismatched", "out_of_order", "unexpected", "malformed_out")
    return {k: v for k, v in result.counts.items() if k in names and v}


def test_clean_output_passes_and_excludes_malformed_input(spark: Any, case: Case) -> None:
    result = check(spark, case)

    assert result.passed, result.to_json()
    assert result.counts["events_in"] == len(case.events) + case.n_malformed
    assert result.counts["malformed_in"] == case.n_malformed > 0
    assert result.counts["records_out"] == len(case.events)
    assert result.counts["keys"] == len(case.apps())
    assert result.examples == {}


def test_duplicated_record_fails_naming_it(spark: Any, case: Case) -> None:
    name, i = case.find("app-3", 5)
    case.files[name].insert(i + 1, {"app_id": "app-3", "pv": 5})  # a replayed update
    case.write()

    result = check(spark, case)

    assert not result.passed
    assert failures(result) == {"duplicates": 1}
    [ex] = result.examples["duplicates"]
    assert ex == {
        "key": "app-3",
        "pv": 5,
        "at": f"{name}:{i + 2}",
        "earlier_at": f"{name}:{i + 1}",
    }
    assert result.to_json()  # examples serialize


def test_dropped_record_fails_naming_the_gap(spark: Any, case: Case) -> None:
    name, i = case.find("app-1", 7)
    del case.files[name][i]
    case.write()

    result = check(spark, case)

    assert failures(result) == {"missing": 1}
    [ex] = result.examples["missing"]
    assert (ex["key"], ex["pv"]) == ("app-1", 7)


def test_dropped_last_record_is_missing_and_mismatched(spark: Any, case: Case) -> None:
    n = sum(1 for app, _, _ in case.events if app == "app-2")
    name, i = case.find("app-2", n)
    del case.files[name][i]
    case.write()

    result = check(spark, case)

    assert failures(result) == {"missing": 1, "mismatched": 1}
    [ex] = result.examples["mismatched"]
    assert (ex["key"], ex["expected"], ex["last_pv"]) == ("app-2", n, n - 1)
    prev_name, k = case.find("app-2", n - 1)
    assert ex["at"] == f"{prev_name}:{k + 1}"  # the last committed update names its place


def test_wrong_final_count_fails(spark: Any, case: Case) -> None:
    n = sum(1 for app, _, _ in case.events if app == "app-0")
    name, i = case.find("app-0", n)
    case.files[name][i]["pv"] = n + 1
    case.write()

    result = check(spark, case)

    assert failures(result) == {"missing": 1, "mismatched": 1, "unexpected": 1}
    assert result.examples["mismatched"][0] | {"at": None} == {
        "key": "app-0",
        "expected": n,
        "last_pv": n + 1,
        "at": None,
    }
    [ex] = result.examples["unexpected"]
    assert (ex["key"], ex["pv"], ex["expected"], ex["at"]) == ("app-0", n + 1, n, f"{name}:{i + 1}")


def test_reordered_records_fail_as_out_of_order(spark: Any, case: Case) -> None:
    name, i = case.find("app-4", 10)
    j = case.files[name].index({"app_id": "app-4", "pv": 11})
    records = case.files[name]
    records[i], records[j] = records[j], records[i]
    case.write()

    result = check(spark, case)

    assert failures(result) == {"out_of_order": 1}
    [ex] = result.examples["out_of_order"]
    assert (ex["key"], ex["pv"], ex["after_pv"], ex["at"]) == ("app-4", 10, 11, f"{name}:{j + 1}")


def test_extra_key_and_garbage_fail(spark: Any, case: Case) -> None:
    first = next(iter(case.files))
    case.files[first].append({"app_id": "app-nope", "pv": 1})
    case.write()
    with (case.out_dir / first).open("a") as f:
        f.write("{not json\n")

    result = check(spark, case)

    assert failures(result) == {"unexpected": 1, "mismatched": 1, "malformed_out": 1}
    assert result.examples["unexpected"][0]["key"] == "app-nope"
    assert result.examples["mismatched"][0]["key"] == "app-nope"
    n = len(case.files[first])
    assert result.examples["malformed_out"] == [{"error": "not JSON", "at": f"{first}:{n + 1}"}]


def test_staged_files_are_ignored(spark: Any, case: Case) -> None:
    junk = "".join(f'{{"app_id": "app-{k % 5}", "pv": {k}}}\n' for k in range(1, 500))
    (case.out_dir / ".part-0001-0000000099.pending").write_text(junk)
    (case.out_dir / ".part-0000-a0-3.inprogress").write_text(junk)

    result = check(spark, case)

    assert result.passed, result.to_json()
    assert any("2 hidden (staged) files ignored" in n for n in result.notes)


def test_staging_module_naming_and_one_input_dir(spark: Any, tmp_path: Path) -> None:
    """part-<checkpoint:010d>-<subtask:04d>.jsonl, as connectors/staging.py writes it."""
    case = build_case(tmp_path, naming="checkpoint_first", parallelism=3, n_files=3)
    assert "part-0000000001-0002.jsonl" in case.files

    result = pv_count_check(
        spark, [case.input_paths[0].parent], read_file_sink_output(spark, case.out_dir)
    )

    assert result.passed, result.to_json()
    assert result.counts["records_out"] == len(case.events)


def test_empty_output_misses_everything(spark: Any, case: Case) -> None:
    case.files.clear()
    case.write()

    result = check(spark, case)

    assert failures(result) == {"missing": len(case.events), "mismatched": len(case.apps())}
    assert len(result.examples["missing"]) == 20
