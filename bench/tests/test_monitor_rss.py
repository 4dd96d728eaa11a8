"""The monitor's peak RSS: the run's own, not the bench process's that started it."""

import sys

from bench.monitor import run_monitored

_HOLD = (
    "import time\nb = bytearray({mb} << 20)\n"
    "for i in range(0, len(b), 4096): b[i] = 1\ntime.sleep(0.6)"
)


def test_a_small_run_started_by_a_big_bench_reports_its_own_size() -> None:
    # the bench holds 300 MB (as it does with a windowed row's expected windows):
    # wait4's ru_maxrss of the child started there, and reported it as the run's
    held = bytearray(300 << 20)
    for i in range(0, len(held), 4096):
        held[i] = 1
    rec = run_monitored([sys.executable, "-c", "import time; time.sleep(0.6)"], timeout=60)
    assert rec.exit_code == 0
    assert 0 < rec.peak_rss_kb < 100 * 1024
    del held


def test_a_run_that_grows_reports_its_peak() -> None:
    rec = run_monitored([sys.executable, "-c", _HOLD.format(mb=200)], timeout=60)
    assert rec.exit_code == 0
    assert 200 * 1024 <= rec.peak_rss_kb < 300 * 1024
