import json

import pytest

from bench.results import (
    RunResult,
    SchemaError,
    apply_refusal,
    compute_ratios,
    document,
    table,
    unavailable,
    validate_document,
)


def _ok(
    system: str,
    eps: float,
    *,
    path: str = "embedded",
    verified: bool | None = True,
    experiment: str = "compare",
) -> RunResult:
    return RunResult(
        system=system,
        path=path,
        experiment=experiment,
        events_per_s=eps,
        events_per_s_repeats=[eps],
        peak_rss_mb=100.0,
        wall_s=2.0,
        exactly_once_verified=verified,
        validator="python",
    )


def test_ratios_are_against_ours_in_the_same_experiment_and_path() -> None:
    runs = [
        _ok("aiostream-ckpt", 1000.0),
        _ok("bare-loop", 1500.0),
        _ok("bytewax", 250.0),
        _ok("aiostream-ckpt", 4000.0, experiment="keys=1e3"),
        unavailable("bare-aiokafka", "kafka", "no broker"),
    ]
    compute_ratios(runs)
    assert runs[0].ratio_to_ours["events_per_s"] == 1.0
    assert runs[1].ratio_to_ours["events_per_s"] == 1.5
    assert runs[2].ratio_to_ours["events_per_s"] == 0.25
    assert runs[2].ratio_to_ours["peak_rss_mb"] == 1.0
    assert runs[3].ratio_to_ours["events_per_s"] == 1.0
    # no ours on the kafka path: no ratio, never one against the embedded path
    assert runs[4].ratio_to_ours["events_per_s"] is None


def test_refused_run_loses_its_figures() -> None:
    run = _ok("bytewax", 250.0, verified=False)
    run.validation = {"summary": "duplicates=3"}
    apply_refusal(run)
    assert run.status == "refused"
    assert run.events_per_s is None and run.peak_rss_mb is None and run.wall_s is None
    assert run.events_per_s_repeats == []
    assert run.withheld is not None and run.withheld["events_per_s"] == 250.0
    assert "duplicates=3" in (run.reason or "")
    # a refused run does not become the reference for ratios
    ours = _ok("aiostream-ckpt", 1000.0, verified=False)
    apply_refusal(ours)
    other = _ok("bare-loop", 1500.0)
    compute_ratios([ours, other])
    assert other.ratio_to_ours["events_per_s"] is None


def test_unchecked_run_keeps_figures() -> None:
    run = apply_refusal(_ok("bare-loop", 1500.0, verified=None))
    assert run.status == "ok" and run.events_per_s == 1500.0


def test_document_schema_round_trip() -> None:
    runs = [_ok("aiostream-ckpt", 1000.0), unavailable("pyflink", "embedded", "pip failed")]
    compute_ratios(runs)
    doc = json.loads(json.dumps(document(runs, mode="quick", params={"events": 10})))
    validate_document(doc)
    assert {r["system"] for r in doc["runs"]} == {"aiostream-ckpt", "pyflink"}
    assert doc["runs"][1]["events_per_s"] is None
    assert doc["machine"]["cores"] >= 1


def test_schema_rejects_throughput_from_wrong_output() -> None:
    doc = {
        "runs": [
            {
                "system": "bytewax",
                "path": "embedded",
                "events_per_s": 5.0,
                "exactly_once_verified": False,
            }
        ]
    }
    with pytest.raises(SchemaError, match="not exactly-once"):
        validate_document(doc)


@pytest.mark.parametrize(
    "run",
    [
        {"system": "flink", "path": "embedded", "events_per_s": 1.0, "exactly_once_verified": True},
        {"system": "faust", "path": "disk", "events_per_s": 1.0, "exactly_once_verified": True},
        {"system": "faust", "path": "kafka", "exactly_once_verified": True},
        {"system": "faust", "path": "kafka", "events_per_s": "fast", "exactly_once_verified": 1},
    ],
)
def test_schema_rejects_malformed_runs(run: dict) -> None:
    with pytest.raises(SchemaError):
        validate_document({"runs": [run]})


def test_unknown_system_is_rejected_at_construction() -> None:
    with pytest.raises(SchemaError):
        RunResult(system="spark-streaming", path="embedded")


def test_table_shows_refusal_and_ratio() -> None:
    runs = [_ok("aiostream-ckpt", 1000.0), _ok("bytewax", 250.0, verified=False)]
    runs[1].validation = {"summary": "gaps=1"}
    apply_refusal(runs[1])
    compute_ratios(runs)
    text = table(runs)
    assert "REFUSED" in text and "gaps=1" in text
    assert "1,000" in text
