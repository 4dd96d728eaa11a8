"""The workers scaling section in the bench's report: rows, targets, Spark, JSON, plots.

No engine runs here: the cases' measurements are synthetic, so the section's
wiring into ``python -m bench --full`` is checked in well under a second.
"""

import json
from pathlib import Path
from typing import Any

import pytest

from bench import cli, kafka, scaling
from bench.plots import plot_spec
from bench.results import RunResult, table
from bench.runner import Measured
from bench.scaling import ScalingPlan, annotate, merge, run_scaling, summary
from bench.scaling_report import section_text
from bench.validation import Verdict

EVENTS = 1_000


def _run(
    workers: int, rate: float, *, path: Path | None = None, case: str = "file-10k"
) -> Measured:
    r = RunResult(system="aiostream-ckpt", path="embedded", experiment=f"workers={workers} {case}")
    r.events, r.events_per_s, r.wall_s = EVENTS, rate, 2 * EVENTS / rate  # wall: half the rate
    r.exactly_once_verified, r.validator = True, "python"
    cpu = {"total_s": 0.004, "main_s": 0.004, "children_s": []}
    if workers == 2:
        cpu = {"total_s": 0.005, "main_s": 0.001, "children_s": [0.002, 0.002]}
    r.config = {"cpu_s": [cpu]}
    r.validation = {"python": [{"passed": True}], "summary": "exactly-once"}
    return Measured(r, [path] if path else [])


def _case(name: str, rate1: float, rate2: float) -> tuple[list[RunResult], dict[str, Any]]:
    one = merge([_run(1, rate1, case=name)], EVENTS).result
    two = merge([_run(2, rate2, case=name)], EVENTS).result
    s = summary(name, one, two, EVENTS)
    annotate(one, two, s)
    return [one, two], s


def test_rows_and_summary_say_ratio_target_cpu_and_whether_met() -> None:
    runs_a, met = _case("file-10k", 100_000.0, 190_000.0)
    runs_b, missed = _case("file-1m", 50_000.0, 60_000.0)
    assert met["target_met"] is True and missed["target_met"] is False
    rows = table(runs_a + runs_b).splitlines()
    w2 = next(ln for ln in rows if "workers=2 file-10k" in ln)
    assert "1.90x w=1, target 1.5x met" in w2 and "CPU s/M ev 5.00 = 1.00+2.00+2.00" in w2
    assert "1.20x w=1, target 1.5x NOT met" in next(ln for ln in rows if "workers=2 file-1m" in ln)
    assert "CPU s/M ev 4.00" in next(ln for ln in rows if "workers=1 file-10k" in ln)
    text = section_text([met, missed])
    assert "= 1.90x (target 1.5x: met)" in text and "exactly-once yes (python)" in text
    assert text.splitlines()[-1].endswith(
        "file-10k 1.90x >= 1.5x met; file-1m 1.20x < 1.5x NOT met -- 1 of 2 met"
    )


def test_spark_verdicts_reach_the_rows_and_a_failed_one_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, str]] = []

    def fake_case(c: scaling.Case, plan: ScalingPlan, work: Path) -> tuple[Measured, Measured]:
        return _run(1, 100.0, path=tmp_path / "o1"), _run(2, 190.0, path=tmp_path / "o2")

    def fake_spark(jobs: list[dict[str, str]]) -> tuple[dict[str, Verdict], None]:
        seen.extend(jobs)
        ok = {j["id"]: Verdict("spark", j["output"].endswith("o1"), {}, "x") for j in jobs}
        return ok, None

    monkeypatch.setattr(scaling, "run_file_case", fake_case)
    monkeypatch.setattr(scaling, "_warm_up", lambda plan, work: None)
    monkeypatch.setattr("bench.runner.spark_validate", fake_spark)
    loads = iter(range(1, 100))
    monkeypatch.setattr("os.getloadavg", lambda: (float(next(loads)),) * 3)
    runs, (s,) = run_scaling(ScalingPlan(EVENTS, 1, ["file-10k"], tmp_path, spark=True))
    # one session for both rows, each against the case's events as one file
    assert [Path(j["input"]).name for j in seen] == ["pv-n1000-k10000-s1-z0-e0.jsonl"] * 2
    assert runs[0].validator == "spark" and runs[0].exactly_once_verified is True
    assert runs[1].status == "refused" and runs[1].events_per_s is None
    assert s["exactly_once"] is False and s["target_met"] is None
    assert s["validators"] == ["spark"]
    assert s["load_avg"][0] == 1.0  # when the case's runs ended, not after Spark


def test_full_mode_writes_the_section_into_json_table_and_plots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plans: list[ScalingPlan] = []

    def fake_scaling(plan: ScalingPlan) -> tuple[list[RunResult], list[dict[str, Any]]]:
        plans.append(plan)
        runs, s = _case("kafka", 10_000.0, 18_000.0)
        return runs, [s]

    monkeypatch.setattr(cli, "run_plan", lambda plan: ([], []))
    monkeypatch.setattr(kafka, "run_kafka_path", lambda plan: [])
    monkeypatch.setattr(scaling, "run_scaling", fake_scaling)
    out = tmp_path / "r.json"
    small = ["--events", "5000", "--repeats", "1", "--no-plots", "--quiet-wait", "0"]
    code = cli.main(["--full", *small, "--work", str(tmp_path / "w"), "--json", str(out)])
    assert code == 0
    (plan,) = plans
    assert plan.spark is True and plan.events == 5000 and plan.repeats == 1
    doc = json.loads(out.read_text())
    (s,) = doc["workers_scaling"]
    assert s["target_met"] is True and s["target_steady_ratio"] == 1.7
    row = next(r for r in doc["runs"] if r["experiment"] == "workers=2 kafka")
    assert row["config"]["workers_scaling"]["target_met"] is True
    printed = capsys.readouterr().out
    assert "1.80x w=1, target 1.7x met" in printed
    assert "kafka 1.80x >= 1.7x met -- 1 of 1 met" in printed
    (bar,) = plot_spec(doc, [])["workers_scaling"]
    assert bar == {
        "case": "kafka",
        "target": 1.7,
        "steady_ratio": 1.8,
        "wall_ratio": 1.8,
        "cpu_bound_ratio": 2.0,
    }
