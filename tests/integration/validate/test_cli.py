"""The CLI: exit codes, one-line errors, and the verdict as the last stdout line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import aiostream_ckpt
from aiostream_ckpt_dev.validate import validate_main

from .conftest import Case, build_case

pytestmark = [pytest.mark.integration, pytest.mark.spark]

REPO_ROOT = Path(aiostream_ckpt.__file__).resolve().parent.parent


def args(case: Case, *extra: str) -> list[str]:
    return ["--input", *map(str, case.input_paths), "--output-dir", str(case.out_dir), *extra]


def run_module(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **env}
    return subprocess.run(
        [sys.executable, "-m", "aiostream_ckpt_dev.validate", *argv],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
        check=False,
    )


def test_pass_exits_0_with_verdict_last(
    spark: Any, case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"

    code = validate_main(args(case, "--json", str(report)))

    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[-1].startswith("validation: PASS pv_count events_in=")
    assert f"records_out={len(case.events)}" in out[-1]
    data = json.loads(report.read_text())
    assert data["passed"] is True
    assert data["results"][0]["counts"]["malformed_in"] == case.n_malformed


def test_fail_exits_1_and_names_the_record(
    spark: Any, case: Case, capsys: pytest.CaptureFixture[str]
) -> None:
    name, i = case.find("app-2", 3)
    case.files[name].append({"app_id": "app-2", "pv": 3})
    case.write()

    code = validate_main(args(case, "--check", "pv_count"))

    out = capsys.readouterr().out
    assert code == 1
    assert out.splitlines()[-1].startswith("validation: FAIL pv_count ")
    assert "duplicates=1" in out.splitlines()[-1]
    assert f"key=app-2 pv=3 at={name}:{len(case.files[name])} earlier_at={name}:{i + 1}" in out


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--input", "x.jsonl"],
        ["--input", "x.jsonl", "--output-dir", "o", "--kafka-topic", "t"],
        ["--input", "x.jsonl", "--kafka-bootstrap", "127.0.0.1:9092"],
        ["--input", "x.jsonl", "--output-dir", "o", "--check", "nope"],
    ],
)
def test_usage_errors_exit_2_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert validate_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1


def test_missing_paths_exit_2(case: Case, capsys: pytest.CaptureFixture[str]) -> None:
    assert validate_main(["--input", "/nonexistent.jsonl", "--output-dir", str(case.out_dir)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert validate_main(["--input", str(case.input_paths[0]), "--output-dir", "/nonexistent"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_no_java_exits_2_naming_java_home(case: Case, tmp_path: Path) -> None:
    r = run_module(args(case), JAVA_HOME=str(tmp_path / "no-jdk"), PATH=str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert "JAVA_HOME" in r.stderr and r.stdout == ""
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    r = subprocess.run(
        [sys.executable, "-m", "aiostream_ckpt_dev.validate", *args(case)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**env, "PYTHONPATH": str(REPO_ROOT), "PATH": str(tmp_path)},
    )
    assert r.returncode == 2
    assert "JAVA_HOME is unset and there is no 'java' on PATH" in r.stderr


def test_python_m_runs_both_checks(tmp_path: Path) -> None:
    """A fresh process (its own JVM): what CI and the demo run."""
    case = build_case(tmp_path, with_pos=True, n_events=1000)
    report = tmp_path / "r.json"

    r = run_module(
        args(
            case,
            "--check",
            "pv_count",
            "--check",
            "positions",
            "--require-field",
            "app_id",
            "--json",
            str(report),
        )
    )

    assert r.returncode == 0, r.stdout + r.stderr
    last = r.stdout.splitlines()[-1]
    assert last.startswith("validation: PASS pv_count events_in=")
    assert "; positions events_in=" in last
    assert [c["check"] for c in json.loads(report.read_text())["results"]] == [
        "pv_count",
        "positions",
    ]
