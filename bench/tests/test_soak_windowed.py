"""The soak's slope and the windowed rows' reference answer (no processes run)."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from bench.soak import (
    cpu_pct,
    cpu_seconds,
    fd_count,
    file_count,
    is_flat,
    rates,
    slope_pct_per_10min,
)
from bench.windowed import (
    SESSION_GAP_MS,
    TUMBLING_MS,
    check_windows,
    expected_windows,
    first_last_rates,
)


def test_slope_is_growth_in_percent_of_the_mean_per_10_minutes() -> None:
    flat = [(t / 10, 100.0 + (t % 2)) for t in range(200)]  # a sawtooth, no trend
    assert abs(slope_pct_per_10min(flat) or 0) < 0.1
    # 100 -> 120 over 20 minutes: +10 per 10 min on a mean of 110
    growing = [(t / 10, 100.0 + t / 10) for t in range(201)]
    assert slope_pct_per_10min(growing) == round(100 * 10 / 110, 3)
    assert slope_pct_per_10min(growing[:2]) is None


def test_flat_means_no_growth_and_no_falling_throughput() -> None:
    # the loaded soak read "flat NO" for a checkpoint dir shrinking 1.15 %/10 min
    steady = {"rss_mb": 0.14, "working_state_mb": 0.0, "events_per_s": 0.0}
    assert is_flat({**steady, "checkpoint_dir_mb": -1.15})
    assert not is_flat({**steady, "checkpoint_dir_mb": 1.2})
    assert is_flat({**steady, "events_per_s": 3.0})  # catching up is not a decline
    assert not is_flat({**steady, "events_per_s": -1.5})
    assert not is_flat({**steady, "rss_mb": None})


def test_the_last_10_percent_ends_when_the_input_is_read() -> None:
    # 1000 events/s throughout, then 5 s of end-of-input drain at the total (the final
    # firing, checkpoint and exit): before, the last 10 % ran to the last sample (167/s)
    read = [(t / 10, 100.0 * t) for t in range(101)]
    drain = [(10.0 + t / 10, 10_000.0) for t in range(1, 51)]
    assert first_last_rates(read + drain, 10_000.0) == (1000.0, 1000.0)


def test_rates_between_samples() -> None:
    samples = [(0.0, 0, 0, 0, 0), (0.5, 0, 0, 0, 30_000), (1.0, 0, 0, 0, 90_000)]
    assert rates(samples) == [(0.25, 1000.0), (0.75, 2000.0)]


def test_cpu_percent_of_a_core_between_samples() -> None:
    # 3 s of CPU in the first 60 s, 30 s in the next 60 s (a spinning loop)
    assert cpu_pct([(0.0, 1.0), (1.0, 4.0), (2.0, 34.0)]) == [(0.5, 5.0), (1.5, 50.0)]
    spent = cpu_seconds([os.getpid()])
    deadline = os.times()[0] + 0.05
    while os.times()[0] < deadline:
        pass
    assert cpu_seconds([os.getpid()]) > spent
    assert cpu_seconds([2**22 + 1]) == 0.0  # no such process


def test_file_and_fd_counts(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ("x", "a/y", "a/b/z"):
        (tmp_path / name).write_bytes(b"")
    assert file_count(tmp_path) == 3
    assert file_count(tmp_path / "missing") == 0
    mine = fd_count([os.getpid()])
    with open(tmp_path / "x", "rb"):
        assert fd_count([os.getpid()]) == mine + 1
    assert fd_count([2**22 + 1]) == 0  # no such process


def test_expected_windows_by_brute_force(tmp_path: Path) -> None:
    g = SESSION_GAP_MS
    events = [
        {"app_id": "a", "user_id": "u", "ts": 0},
        {"app_id": "a", "user_id": "u", "ts": g},  # touches [0, g): merges
        {"app_id": "b", "user_id": "u", "ts": 3 * g},  # a gap: a new session
        {"app_id": "a", "user_id": "v", "ts": TUMBLING_MS},
    ]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    assert expected_windows(path, "tumbling") == {
        ("a", 0, TUMBLING_MS): 1,
        ("a", g - g % TUMBLING_MS, g - g % TUMBLING_MS + TUMBLING_MS): 1,
        ("b", 3 * g, 3 * g + TUMBLING_MS): 1,
        ("a", TUMBLING_MS, 2 * TUMBLING_MS): 1,
    }
    assert expected_windows(path, "session") == {
        ("u", 0, 2 * g): 2,
        ("u", 3 * g, 4 * g): 1,
        ("v", TUMBLING_MS, TUMBLING_MS + g): 1,
    }


def test_check_windows_finds_duplicates_missing_and_wrong_counts(
    tmp_path: Path, monkeypatch
) -> None:
    expected = {("a", 0, 10): 2, ("b", 0, 10): 1, ("c", 0, 10): 5}
    out = [
        {"key": "a", "start": 0, "end": 10, "count": 2},
        {"key": "a", "start": 0, "end": 10, "count": 2},
        {"key": "b", "start": 0, "end": 10, "count": 7},
    ]
    monkeypatch.setattr("bench.windowed.read_committed_output", lambda _d: iter(out))
    v = check_windows(tmp_path, expected)
    assert not v.passed
    assert (v.counts["duplicates"], v.counts["missing"], v.counts["wrong_count"]) == (1, 1, 1)
    monkeypatch.setattr(
        "bench.windowed.read_committed_output",
        lambda _d: iter(
            [{"key": k, "start": s, "end": e, "count": n} for (k, s, e), n in expected.items()]
        ),
    )
    assert check_windows(tmp_path, expected).passed
