"""A savepoint restored with another allowed lateness: window output stays exactly once.

The job (``tests.apps.late_windows``) is stopped with a savepoint mid-input and
restored with another ``app.lateness``. Taken with 60 s, the savepoint holds
the windows of the last 60 s of event time that fired and wait for their
cleanup; restored without lateness, they used to fire again (each such
window twice in the committed output). The input has no record for a fired
window but very late ones (late under both), so the output is the
failure-free one whatever the lateness. Restored with a lower lateness, a
fired window's cleanup may fall on another fired window's end: that window
does not fire again either.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from aiostream_ckpt.checkpoint.storage import read_checkpoint
from aiostream_ckpt.connectors.staging import read_committed_output
from tests.apps import late_windows as app
from tests.helpers import DaemonProcess, cli

pytestmark = pytest.mark.integration

TOKEN = "lateness-token"
EVENTS = 60_000


def _args(tmp: Path, inputs: Path, lateness: int, *extra: str) -> list[str]:
    return [
        "run", "tests.apps.late_windows",
        "--set", f"checkpoint.dir={tmp / 'ckpt'}",
        "--set", f"app.input={inputs}",
        "--set", f"app.output={tmp / 'out'}",
        "--set", f"app.late_output={tmp / 'late'}",
        "--set", f"app.lateness={lateness}",
        "--set", "checkpoint.interval=100ms",
        "--set", "job.batch_size=256",
        *extra,
    ]  # fmt: skip


# (60 s, one window): a fired window's new cleanup is at the next one's end, which fired
# too; that cleanup's timer used to fire the next window again (duplicates)
@pytest.mark.parametrize(("before", "after"), [(60_000, 0), (0, 60_000), (60_000, app.WINDOW_MS)])
def test_restore_with_another_lateness_fires_each_window_once(
    tmp_path: Path, before: int, after: int
) -> None:
    _stop_and_restore(tmp_path, before, after)


@pytest.mark.parametrize(
    ("taken", "restored"),
    [
        (("job.parallelism=2", "job.workers=2"), ("job.parallelism=1",)),
        ((), ("job.parallelism=3",)),
    ],
    ids=["2-in-2-workers-to-1", "1-to-3"],
)
def test_restore_with_another_lateness_and_parallelism_fires_each_window_once(
    tmp_path: Path, taken: tuple[str, ...], restored: tuple[str, ...]
) -> None:
    # key groups move between subtasks (and out of a worker process) as the lateness drops
    # to one window: fired windows land where the new cleanup falls on another's end
    _stop_and_restore(tmp_path, 60_000, app.WINDOW_MS, taken, restored)


def _stop_and_restore(
    tmp_path: Path,
    before: int,
    after: int,
    taken: tuple[str, ...] = (),
    restored_with: tuple[str, ...] = (),
) -> None:
    """Stop with a savepoint mid-input, restore with ``after``; the output is exactly once."""
    sets_taken = [a for s in taken for a in ("--set", s)]
    sets_restored = [a for s in restored_with for a in ("--set", s)]
    events = app.generate(EVENTS, seed=7, late_every=64)
    inputs = app.write(tmp_path / "in.jsonl", events)
    paced = _args(
        tmp_path, inputs, before, "--set", "app.rate=20000", "--set", "rest.port=0", *sets_taken
    )
    with DaemonProcess(*paced, env={"AIOSTREAM_REST__TOKEN": TOKEN}) as d:
        d.wait_for("checkpoint 3 completed")
        status, sp = d.request("POST", "/job/stop-with-savepoint", token=TOKEN)
        assert status == 200, sp
        assert d.wait() == 0, d.stderr[-3000:]
    states = read_checkpoint(Path(sp["path"])).subtask_states("events").values()
    read = sum(sum(st["operator"]["positions"].values()) for st in states)
    assert 0 < read < inputs.stat().st_size, "mid-input"
    restored = cli(
        *_args(tmp_path, inputs, after, "--set", "rest.enabled=false", *sets_restored),
        "--from-savepoint",
        sp["path"],
    )
    assert restored.returncode == 0, restored.stderr[-3000:]
    want_counts, want_late = app.expected(events)
    got = Counter((r["k"], r["start"], r["n"]) for r in read_committed_output(tmp_path / "out"))
    want = Counter((k, start, n) for (k, start), n in want_counts.items())
    assert got == want, (sorted((got - want).items())[:5], sorted((want - got).items())[:5])
    got_late = sorted(r["late"] for r in read_committed_output(tmp_path / "late"))
    assert got_late == sorted(want_late)
