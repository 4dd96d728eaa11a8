"""The workers scaling section's arithmetic: CPU per million events, merged repeats, ratios."""

from bench.results import RunResult
from bench.runner import Measured
from bench.scaling import cpu_per_million, merge, scaling_line, summary


def _run(rate: float, wall: float, cpu: dict, verdict: bool | None = True) -> Measured:
    r = RunResult(system="aiostream-ckpt", path="embedded", events=2_000_000)
    r.events_per_s, r.wall_s, r.peak_rss_mb = rate, wall, 60.0
    r.exactly_once_verified = verdict
    r.config = {"cpu_s": [cpu], "background_cores_before_runs": [0.1]}
    r.validation = {"python": [{"passed": verdict}], "summary": "exactly-once"}
    return Measured(r)


def test_cpu_per_million_takes_medians_per_process() -> None:
    cpus = [
        {"total_s": 9.0, "main_s": 1.0, "children_s": [4.0, 4.0]},
        {"total_s": 11.0, "main_s": 1.2, "children_s": [5.0, 4.8]},
        {"total_s": 10.0, "main_s": 1.1, "children_s": [4.4, 4.5]},
    ]
    got = cpu_per_million(cpus, 2_000_000)
    assert got == {"total": 5.0, "main": 0.55, "workers": [2.2, 2.25]}
    assert cpu_per_million([{"total_s": 4.0, "main_s": 4.0, "children_s": []}], 1_000_000) == {
        "total": 4.0,
        "main": 4.0,
    }


def test_merged_repeats_keep_every_verdict_and_the_median_rate() -> None:
    cpu = {"total_s": 4.0, "main_s": 4.0, "children_s": []}
    one = merge([_run(100.0, 20.0, cpu), _run(120.0, 18.0, cpu), _run(90.0, 22.0, cpu)], 2_000_000)
    assert one.result.events_per_s == 100.0 and one.result.wall_s == 20.0
    assert one.result.exactly_once_verified is True and len(one.result.config["cpu_s"]) == 3
    bad = merge([_run(100.0, 20.0, cpu), _run(150.0, 15.0, cpu, verdict=False)], 2_000_000)
    assert bad.result.exactly_once_verified is False
    two = merge(
        [_run(180.0, 12.0, {"total_s": 5.0, "main_s": 0.6, "children_s": [2.2, 2.2]})], 2_000_000
    )
    s = summary("file-10k", one.result, two.result, 2_000_000)
    assert s["steady_ratio"] == 1.8 and s["wall_ratio"] == round(20.0 / 12.0, 2)
    assert s["exactly_once"] and s["target_steady_ratio"] == 1.5
    # one process's CPU (2.0 s per M events) against the busier worker's (1.1)
    assert s["cpu_bound_ratio"] == round(2.0 / 1.1, 2)


def test_summary_keeps_the_summed_positions_ratio_beside_the_slowest_readers() -> None:
    cpu = {"total_s": 4.0, "main_s": 4.0, "children_s": []}
    runs1 = [_run(100.0, 20.0, cpu), _run(110.0, 19.0, cpu)]
    runs2 = [_run(180.0, 12.0, cpu), _run(190.0, 11.0, cpu)]
    for m, summed in zip(runs1 + runs2, (105, 115, 230, 250), strict=True):
        m.result.config["steady_summed_events_per_s"] = [summed]
        m.result.config["steady_windows"] = [(1.5, 1)]
    one, two = merge(runs1, 2_000_000), merge(runs2, 2_000_000)
    assert one.result.config["steady_summed_events_per_s"] == [105, 115]
    s = summary("file-10k-kg", one.result, two.result, 2_000_000)
    assert s["steady_ratio"] == round(185.0 / 105.0, 2)  # medians of the repeats
    assert s["steady_summed_ratio"] == round(240.0 / 110.0, 2)
    assert s["workers_2"]["steady_windows"] == [(1.5, 1), (1.5, 1)]
    assert "summed positions 2.18x" in scaling_line(s)
    assert "SHORT windows" in scaling_line(s)  # one checkpoint inside each: by chance
    for w in (s["workers_1"], s["workers_2"]):
        w["steady_windows"] = [(3.1, 3), (2.9, 2)]
    assert "SHORT" not in scaling_line(s)
