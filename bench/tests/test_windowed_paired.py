"""The windowed rows' ratio to pv_count, paired with a pv_count run right before each repeat."""

from __future__ import annotations

from bench.results import RunResult
from bench.windowed import annotate, paired_ratio


def _row(rates: list[float]) -> RunResult:
    res = RunResult(system="aiostream-ckpt", path="embedded", experiment="windows=session")
    res.events, res.events_per_s = 1_000_000, sorted(rates)[len(rates) // 2]
    res.events_per_s_repeats = rates
    res.series = {"progress": [(t / 10, t * 20_000.0) for t in range(501)], "checkpoints": []}
    return res


def test_each_repeat_is_divided_by_the_pv_count_run_before_it() -> None:
    # the machine slows between the compare row and the windowed one, and within the row:
    # by the rows' medians 190 k / 470 k = 0.40; each repeat over its own reference: 0.50
    compare = RunResult(system="aiostream-ckpt", path="embedded", experiment="compare")
    compare.events_per_s = 470_000
    rates, references = [190_000.0, 210_000.0, 170_000.0], [380_000.0, 420_000.0, 340_000.0]
    assert paired_ratio(rates, references) == 0.5
    res = _row(rates)
    annotate(res, "session", compare, paired=references)
    fig = res.config["windowed"]
    assert fig["x_pv_count"] == 0.404
    assert fig["x_pv_count_paired"] == 0.5
    assert fig["pv_count_paired_events_per_s"] == [380_000, 420_000, 340_000]
    assert fig["meets_x_pv_count"] is True  # 0.5 meets the target of 0.5


def test_without_references_the_medians_ratio_is_judged() -> None:
    compare = RunResult(system="aiostream-ckpt", path="embedded", experiment="compare")
    compare.events_per_s = 400_000
    res = _row([150_000.0])
    annotate(res, "session", compare)
    fig = res.config["windowed"]
    assert "x_pv_count_paired" not in fig
    assert fig["x_pv_count"] == 0.375 and fig["meets_x_pv_count"] is False
    assert paired_ratio([1.0], []) is None
