from bench.stats import percentile, ratio, spread, steady_window, summarize


def test_percentile_interpolates() -> None:
    assert percentile([], 50) is None
    assert percentile([10.0, 20.0], 50) == 15.0
    assert percentile([1, 2, 3, 4, 5], 100) == 5.0
    assert percentile([1, 2, 3, 4, 5], 0) == 1.0


def test_spread_and_summary() -> None:
    sp = spread([100.0, 90.0, 110.0])
    assert sp is not None
    assert (sp.median, sp.low, sp.high, sp.n) == (100.0, 90.0, 110.0, 3)
    assert abs(sp.rel - 0.1) < 1e-9
    s = summarize([float(i) for i in range(1, 101)], (50, 99, 99.9))
    assert s is not None
    assert s["p50"] == 50.5 and s["p99"] > 99 and s["max"] == 100.0 and s["n"] == 100
    assert "p999" in s


def test_steady_window_ignores_startup_and_drain() -> None:
    # 1 s of start-up with no progress, then 1000 units/s for 10 s, then a slow drain
    samples = [(0.1 * i, 0.0) for i in range(10)]
    samples += [(1.0 + 0.1 * i, 100.0 * i) for i in range(101)]
    samples += [(11.0 + i, 10000.0 + 10 * i) for i in range(1, 5)]
    w = steady_window(samples, 10040.0)
    assert w is not None
    assert abs(w.rate - 1000.0) < 1e-6
    assert all(abs(r - 1000.0) < 1e-6 for r in w.bucket_rates)
    assert 2.0 <= w.t_start <= 2.2  # first sample past 10 % of the total


def test_steady_window_needs_two_samples() -> None:
    assert steady_window([(1.0, 50.0)], 100.0) is None
    assert steady_window([], 100.0) is None
    assert steady_window([(0.0, 0.0), (1.0, 100.0)], 0.0) is None


def test_ratio() -> None:
    assert ratio(300.0, 1200.0) == 0.25
    assert ratio(None, 5.0) is None
    assert ratio(5.0, None) is None
    assert ratio(5.0, 0.0) is None
