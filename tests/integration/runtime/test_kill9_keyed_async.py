"""kill -9 under ``key_by(...).map_async(KeyedAsyncFunction)``: state writes exactly once.

Calls in flight at a checkpoint have read their key's count and not yet had
their write applied; after a restore they are issued again. A write applied
early would count an event twice (a duplicate ``pv``), a lost one would leave
a gap: the committed output per key must be exactly 1..n.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import (
    DaemonProcess,
    check_pv_output,
    make_pv_input,
    recount,
    run_app_under_kills,
)

pytestmark = pytest.mark.integration


def _args(tmp: Path, inp: Path, p: int) -> list[str]:
    return [
        "run", "tests.apps.async_pv_count",
        "--set", f"checkpoint.dir={tmp / 'ckpt'}",
        "--set", f"app.input={inp}",
        "--set", f"app.output={tmp / 'out'}",
        "--set", "checkpoint.interval=50ms",
        "--set", f"job.parallelism={p}",
        "--set", "job.batch_size=256",
        "--set", "rest.enabled=false",
    ]  # fmt: skip


def test_keyed_async_state_exactly_once_under_kill9(tmp_path: Path) -> None:
    inp = make_pv_input(tmp_path / "in.jsonl", 60_000, seed=70, keys=300)
    run_app_under_kills(
        tmp_path,
        "tests.apps.async_pv_count",
        [f"app.input={inp}", f"app.output={tmp_path / 'out'}", "rest.enabled=false"],
        kills=2,
        seed=7,
        inputs=[inp],
        parallelism=2,
        batch_size=256,
        max_delay_after_checkpoint=0.12,
    )
    check = check_pv_output(tmp_path / "out", recount(inp))
    assert check.exact, (check.duplicates, check.missing, check.gaps[:5])


def test_killed_at_parallelism_2_resumed_at_3(tmp_path: Path) -> None:
    inp = make_pv_input(tmp_path / "in.jsonl", 60_000, seed=71, keys=300)
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
