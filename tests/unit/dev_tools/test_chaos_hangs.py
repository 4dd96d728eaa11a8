"""chaos.windows hangs: a worker SIGSTOPped by plan, caught by its heartbeats (``make chaos``)."""

from __future__ import annotations

import random

import pytest

from aiostream_ckpt_dev.chaos.windows import END_WINDOWS, HANG, Kill, _Seen, plan_round


def test_a_hang_round_stops_workers_between_its_first_and_its_end_kills() -> None:
    plan = plan_round(random.Random(3), 8, workers=2, hangs=True)
    assert plan[0].window == "metadata_durable"
    assert tuple(k.window for k in plan[-2:]) == END_WINDOWS
    middle = plan[1:-2]
    assert len(middle) == 5 and all(k.window == HANG for k in middle)
    assert all(k.worker in (0, 1) and 0.02 <= k.fraction <= 0.25 for k in middle)
    hang = middle[0]
    assert hang.by_position and hang.env() == {} and hang.in_worker(2)
    assert hang.label(2) == "worker:hang"


def test_hangs_need_workers_and_input_positions() -> None:
    with pytest.raises(ValueError, match=r"job\.workers > 1"):
        plan_round(random.Random(3), 4, workers=1, hangs=True)
    with pytest.raises(ValueError, match="input files"):
        plan_round(random.Random(3), 4, workers=2, hangs=True, position=False)


def test_after_a_hang_only_a_checkpoint_after_the_heartbeat_failure_counts() -> None:
    """One completing right after the SIGSTOP was acked before it: killing main then skips
    the heartbeats, the very thing the round is there to show."""
    seen = _Seen(watch_failpoint=False, hang=True)
    seen.worker_killed.set()
    seen.line(b"... checkpoint 7 completed in 30 ms (100 bytes)\n")
    assert not seen.checkpoint_after.is_set() and not seen.caught.is_set()
    seen.line(
        b"... failed (WorkerError: worker 1 (pid 9) unheard for 5.1s: no heartbeat within 5s "
        b"(job.heartbeat_timeout): hung, killed); restart 1 in 0.1s\n"
    )
    assert seen.caught.is_set() and not seen.checkpoint_after.is_set()
    seen.line(b"... checkpoint 8 completed in 30 ms (100 bytes)\n")
    assert seen.checkpoint_after.is_set()


def test_a_kill_counts_the_first_checkpoint_after_it_as_before() -> None:
    seen = _Seen(watch_failpoint=True)
    seen.line(b"failpoint sink_commit: SIGKILL at hit 2\n")
    seen.line(b"... checkpoint 8 completed in 30 ms (100 bytes)\n")
    assert seen.worker_killed.is_set() and seen.checkpoint_after.is_set()
    assert Kill("position", worker=None).in_worker(2) is False
