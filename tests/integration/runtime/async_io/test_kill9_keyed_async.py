"""kill -9 under ``key_by(...).map_async(KeyedAsyncFunction)``: state writes exactly once.

Calls in flight at a checkpoint have read their key's count and not yet had
their write applied; after a restore they are issued again. A write applied
early would count an event twice (a duplicate ``pv``), a lost one would leave
a gap: the committed output per key must be exactly 1..n.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aiostream_ckpt.connectors.staging import read_committed_output
from tests.helpers import (
    DaemonProcess,
    check_pv_output,
    make_pv_input,
    recount,
    run_app_under_kills,
)

pytestmark = pytest.mark.integration

#: Events, read at most RATE a second: a pass lasts >= 1.6 s, 30 checkpoint intervals, on any
#: machine (the 1 ms lookups at capacity 64 alone bound 20 k events to ~0.3 s only).
EVENTS, RATE = 20_000, 12_000


def _args(tmp: Path, inp: Path, p: int) -> list[str]:
    return [
        "run", "tests.apps.async_pv_count",
        "--set", f"checkpoint.dir={tmp / 'ckpt'}",
        "--set", f"app.input={inp}",
        "--set", f"app.output={tmp / 'out'}",
        "--set", f"app.rate={RATE}",
        "--set", "checkpoint.interval=50ms",
        "--set", f"job.parallelism={p}",
        "--set", "job.batch_size=256",
        "--set", "rest.enabled=false",
    ]  # fmt: skip


def _killed_twice(tmp_path: Path, app: str, inp: Path, seed: int, rate: int) -> Path:
    """Run ``app`` on ``inp`` (``rate`` events/s) at parallelism 2 under two kill -9."""
    out = tmp_path / "out"
    run_app_under_kills(
        tmp_path,
        app,
        [f"app.input={inp}", f"app.output={out}", f"app.rate={rate}"],
        kills=2,
        seed=seed,
        inputs=[inp],
        parallelism=2,
        batch_size=256,
        max_delay_after_checkpoint=0.12,
    )
    check = check_pv_output(out, recount(inp))
    assert check.exact, (check.duplicates, check.missing, check.gaps[:5])
    return out


def test_keyed_async_state_exactly_once_under_kill9(tmp_path: Path) -> None:
    inp = make_pv_input(tmp_path / "in.jsonl", EVENTS, seed=70, keys=300)
    _killed_twice(tmp_path, "tests.apps.async_pv_count", inp, seed=7, rate=RATE)


def test_list_map_and_reducing_state_exactly_once_under_kill9(tmp_path: Path) -> None:
    """The same rule for the other state kinds: pv (the list's length) is 1..n per key, and
    the map's total and the sum agree with it on every record."""
    inp = make_pv_input(tmp_path / "in.jsonl", 10_000, seed=72, keys=100)
    out = _killed_twice(tmp_path, "tests.apps.async_state_kinds", inp, seed=8, rate=RATE // 2)
    disagree = [r for r in read_committed_output(out) if not r["pv"] == r["map_n"] == r["sum_n"]]
    assert not disagree, disagree[:5]


def test_killed_at_parallelism_2_resumed_at_3(tmp_path: Path) -> None:
    inp = make_pv_input(tmp_path / "in.jsonl", EVENTS, seed=71, keys=300)
    with DaemonProcess(*_args(tmp_path, inp, 2)) as first:
        first.wait_for("checkpoint 3 completed", timeout=120)
        first.proc.kill()  # SIGKILL
        first.proc.wait()
    assert not check_pv_output(tmp_path / "out", recount(inp)).exact  # it was cut short
    with DaemonProcess(*_args(tmp_path, inp, 3)) as second:
        assert second.wait(timeout=300) == 0, second.stderr[-3000:]
        assert "restoring from checkpoint" in second.stderr
    check = check_pv_output(tmp_path / "out", recount(inp))
    assert check.exact, (check.duplicates, check.missing, check.gaps[:5])
