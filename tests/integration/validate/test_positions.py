"""positions: every valid input position is in the output exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt_dev.validate import CheckResult, positions_check, read_file_sink_output

from .conftest import Case, build_case

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def pos_case(tmp_path: Path) -> Case:
    return build_case(tmp_path, with_pos=True)


def check(spark: Any, case: Case) -> CheckResult:
    out = read_file_sink_output(spark, case.out_dir)
    return positions_check(spark, case.input_paths, out, require_field="app_id")


def line_of(case: Case, src: str, off: int) -> int:
    """1-based line number of the line starting at byte ``off`` (from the file itself)."""
    path = next(p for p in case.input_paths if p.name == src)
    return path.read_bytes()[:off].count(b"\n") + 1


def test_positions_pass(spark: Any, pos_case: Case) -> None:
    result = check(spark, pos_case)

    assert result.passed, result.to_json()
    assert result.counts["records_out"] == len(pos_case.events)
    assert result.counts["malformed_in"] == pos_case.n_malformed


def test_positions_duplicate_and_missing_are_named(spark: Any, pos_case: Case) -> None:
    _, src, off = pos_case.events[100]
    name, i = pos_case.find(*_app_pv(pos_case, 100))
    pos_case.files[name].append(dict(pos_case.files[name][i]))  # same input line twice
    _, lost_src, lost_off = pos_case.events[2000]
    lost_name, j = pos_case.find(*_app_pv(pos_case, 2000))
    del pos_case.files[lost_name][j]
    pos_case.write()

    result = check(spark, pos_case)

    assert not result.passed
    assert (result.counts["duplicates"], result.counts["missing"]) == (1, 1)
    assert result.counts["unexpected"] == 0
    [dup] = result.examples["duplicates"]
    assert dup == {
        "src": src,
        "off": off,
        "input_at": f"{src}:{line_of(pos_case, src, off)}",
        "at": f"{name}:{len(pos_case.files[name])}",
        "earlier_at": f"{name}:{i + 1}",
    }
    [miss] = result.examples["missing"]
    assert miss == {
        "src": lost_src,
        "off": lost_off,
        "input_at": f"{lost_src}:{line_of(pos_case, lost_src, lost_off)}",
    }


def test_position_of_a_malformed_line_is_unexpected(spark: Any, pos_case: Case) -> None:
    data = pos_case.input_paths[0].read_bytes()
    bad_off = data.index(b"not json")
    first = next(iter(pos_case.files))
    path = str(pos_case.input_paths[0])
    pos_case.files[first].append({"app_id": "app-1", "pv": 0, "_pos": [path, bad_off]})
    pos_case.write()

    result = check(spark, pos_case)

    assert result.counts["unexpected"] == 1
    [ex] = result.examples["unexpected"]
    assert (ex["src"], ex["off"]) == (pos_case.input_paths[0].name, bad_off)


def _app_pv(case: Case, index: int) -> tuple[str, int]:
    app = case.events[index][0]
    return app, sum(1 for a, _, _ in case.events[: index + 1] if a == app)
