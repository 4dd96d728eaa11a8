"""kill -9 under ``connect(...).key_by(...).process``: shared keyed state stays exactly-once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import (
    DaemonProcess,
    check_pv_output,
    in_flight_records,
    make_pv_input,
    recount,
    run_app_under_kills,
)

pytestmark = pytest.mark.integration

#: Events of the first input, read at most RATE a second: a pass lasts >= 1.7 s, 34 checkpoint
#: intervals, on any machine (300 k unpaced stood in for that: ~4x the CPU).
EVENTS, RATE = 100_000, 60_000


@pytest.mark.parametrize("parallelism", [1, 2])
def test_connected_streams_exactly_once_under_kill9(tmp_path: Path, parallelism: int) -> None:
    a = make_pv_input(tmp_path / "a.jsonl", EVENTS, seed=60, malformed=1)
    b = make_pv_input(tmp_path / "b.jsonl", EVENTS * 2 // 3, seed=61, keys=150)
    out = tmp_path / "out"
    run_app_under_kills(
        tmp_path,
        "tests.apps.co_count",
        [f"app.input_a={a}", f"app.input_b={b}", f"app.output={out}", f"app.rate={RATE}"],
        kills=2,
        seed=parallelism,
        inputs=[a, b],
        parallelism=parallelism,
        max_delay_after_checkpoint=0.12,
    )
    check = check_pv_output(out, recount(a, b))
    assert check.exact, (check.duplicates, check.missing, check.gaps[:5])


def test_connected_streams_unaligned_at_two_workers_under_kill9(tmp_path: Path) -> None:
    """Unaligned checkpoints: both inputs' records in flight, across the workers' socket."""
    a = make_pv_input(tmp_path / "a.jsonl", EVENTS, seed=64, malformed=1)
    b = make_pv_input(tmp_path / "b.jsonl", EVENTS * 2 // 3, seed=65, keys=150)
    out = tmp_path / "out"
    _, log = run_app_under_kills(
        tmp_path,
        "tests.apps.co_count",
        [
            f"app.input_a={a}",
            f"app.input_b={b}",
            f"app.output={out}",
            f"app.rate={RATE}",
            "checkpoint.unaligned=true",
            "job.workers=2",
            "restart.delay=0s",
        ],
        kills=2,
        seed=7,
        inputs=[a, b],
        parallelism=2,
        max_delay_after_checkpoint=0.12,
        kill_workers=True,
    )
    check = check_pv_output(out, recount(a, b))
    assert check.exact, (check.duplicates, check.missing, check.gaps[:5])
    assert in_flight_records(log.read_text()), "no checkpoint held in-flight records"


def test_killed_at_parallelism_2_resumed_at_3(tmp_path: Path) -> None:
    """The shared keyed state is redistributed by key group: still exactly once."""
    a = make_pv_input(tmp_path / "a.jsonl", EVENTS, seed=62)
    b = make_pv_input(tmp_path / "b.jsonl", EVENTS, seed=63)
    out = tmp_path / "out"

    def args(p: int) -> list[str]:
        return [
            "run", "tests.apps.co_count",
            "--set", f"checkpoint.dir={tmp_path / 'ckpt'}",
            "--set", f"app.input_a={a}",
            "--set", f"app.input_b={b}",
            "--set", f"app.output={out}",
            "--set", f"app.rate={RATE}",
            "--set", "checkpoint.interval=50ms",
            "--set", f"job.parallelism={p}",
            "--set", "job.batch_size=512",
        ]  # fmt: skip

    with DaemonProcess(*args(2)) as first:
        first.wait_for("checkpoint 3 completed", timeout=120)
        first.proc.kill()  # SIGKILL
        first.proc.wait()
    assert not (out.exists() and check_pv_output(out, recount(a, b)).exact)  # it was cut short
    with DaemonProcess(*args(3)) as second:
        assert second.wait(timeout=300) == 0, second.stderr[-3000:]
        assert "restoring from checkpoint" in second.stderr
    check = check_pv_output(out, recount(a, b))
    assert check.exact, (check.duplicates, check.missing, check.gaps[:5])
