"""kill -9 and rescale with process windows' appended chunks in the checkpoints.

A process window written to keyed state more than once is appended to in
chunks, folded as a log-structured merge (``runtime/windowing/window_chunks.py``): the
tumbling windows at each barrier and past their held bound (here 8 windows,
from ``state.cache_max_entries``), the sliding windows on every batch. The
checkpoints hold lists with chunks mid-window, so a restore must give each
window its list then its chunks in order, at the same parallelism and at
another (1 -> 2 -> 2 -> 1: key groups move with their chunks), and the
tumbling windows go on appending to the restored chunks while the sliding
ones fold them into their lists at open. The kills land anywhere: mid-batch
between a chunk's put and the fold's removes, mid-snapshot, right after a
restore. Each window must fire once (with allowed lateness, again for each
event after that), with exactly its events in the order they arrived (a
key's events come from one input file, in its order).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.checkpoint.storage import read_checkpoint
from aiostream_ckpt.connectors.staging import read_committed_output
from aiostream_ckpt.runtime.windowing.window_operator import WINDOW_APPENDS
from aiostream_ckpt.state.descriptors import MapStateDescriptor
from aiostream_ckpt.state.keygroups import KeyGroupRange
from aiostream_ckpt.state.lmdb.backend import LmdbStateBackend
from tests.apps import chunked_windows as app
from tests.helpers import REPO, cli_cmd, run_app_under_kills

pytestmark = pytest.mark.integration

#: 16,000 events at 2,000 a second: a pass lasts >= 8 s, ~30 checkpoints of 250 ms; a
#: tumbling window spans ~1 s of input (4 barriers), a sliding one ~2 s
EVENTS, RATE = 16_000, 2_000


@pytest.mark.parametrize(("seed", "lateness", "max_delta_ratio"), [(0, 0, 0.5), (1, 5_000, 0)])
def test_chunked_process_windows_exact_under_kill9_and_rescale(
    tmp_path: Path, seed: int, lateness: int, max_delta_ratio: float
) -> None:
    """Seed 1: allowed lateness, late firings; keyed state in chains of 10 deltas."""
    events = app.generate(EVENTS, seed=seed, late_by=lateness)
    inputs = [app.write(tmp_path / "in.jsonl", events)]
    tumbling, sliding = tmp_path / "tumbling", tmp_path / "sliding"
    _, log = run_app_under_kills(
        tmp_path,
        "tests.apps.chunked_windows",
        [
            f"app.input={inputs[0]}",
            f"app.tumbling_output={tumbling}",
            f"app.sliding_output={sliding}",
            f"app.rate={RATE}",
            f"app.lateness={lateness}",
            "checkpoint.interval=250ms",
            "state.cache_max_entries=8",  # the tumbling windows' held bound: 8
            f"checkpoint.max_delta_ratio={max_delta_ratio}",
            "checkpoint.retained=1000",  # the restored ones are read below
        ],
        kills=4,
        seed=seed,
        inputs=inputs,
        parallelism=[1, 2, 2, 1],
        batch_size=64,
    )
    text = log.read_text()
    restored = [int(c) for c in re.findall(r"restoring from checkpoint (\d+)", text)]
    assert len(restored) >= 4, text[-3000:]
    for uid in ("tumbling", "sliding"):  # what the test is about: restored with chunks
        chunks = [_chunks(tmp_path, cid, uid) for cid in restored]
        assert any(chunks), (uid, restored, chunks)
    want = app.expected(events)
    for name, out in (("tumbling", tumbling), ("sliding", sliding)):
        got = read_committed_output(out)
        _assert_firings(name, got, want[name], late_firings=lateness > 0)


#: Each run of the failpoint test: its parallelism and where it dies (None: the end)
FAILPOINT_RUNS = [
    (1, "metadata_durable=kill@6"),  # checkpoint 6 durable, its output not committed
    (2, "restore_after_sinks=kill"),  # rescaled, chunks folded at open, nothing processed
    (2, "pre_barrier_flush=kill@16"),  # buffered windows appended for a barrier, no snapshot
    (2, "snapshot_write=kill@24"),  # a state file written, not yet fsynced
    (1, "metadata_durable=kill@1"),  # rescaled: its first checkpoint durable
    (1, None),
]


def test_chunked_process_windows_exact_when_killed_at_failpoints(tmp_path: Path) -> None:
    """The narrow windows a random kill rarely hits, named by failpoints, 1 -> 2 -> 1."""
    lateness = 3_000
    events = app.generate(EVENTS, seed=2, late_by=lateness)
    inputs = [app.write(tmp_path / "in.jsonl", events)]
    tumbling, sliding = tmp_path / "tumbling", tmp_path / "sliding"
    sets = {
        "checkpoint.dir": tmp_path / "ckpt",
        "checkpoint.interval": "250ms",
        "checkpoint.retained": 1000,
        "state.cache_max_entries": 8,
        "job.batch_size": 64,
        "rest.enabled": "false",
        "app.input": inputs[0],
        "app.tumbling_output": tumbling,
        "app.sliding_output": sliding,
        "app.rate": RATE,
        "app.lateness": lateness,
    }
    log = ""
    for parallelism, failpoint in FAILPOINT_RUNS:
        args = [f"{k}={v}" for k, v in {**sets, "job.parallelism": parallelism}.items()]
        run = subprocess.run(
            cli_cmd("run", "tests.apps.chunked_windows", *(a for s in args for a in ("--set", s))),
            cwd=REPO,
            env={**os.environ, "AIOSTREAM_FAILPOINTS": failpoint or ""},
            capture_output=True,
            text=True,
            timeout=120,
        )
        log += run.stderr
        want_rc = 0 if failpoint is None else -9
        assert run.returncode == want_rc, (failpoint, run.stderr[-3000:])
    restored = [int(c) for c in re.findall(r"restoring from checkpoint (\d+)", log)]
    assert len(restored) == len(FAILPOINT_RUNS) - 1, log[-3000:]
    for uid in ("tumbling", "sliding"):
        chunks = [_chunks(tmp_path, cid, uid) for cid in restored]
        assert any(chunks), (uid, restored, chunks)
    want = app.expected(events)
    for name, out in (("tumbling", tumbling), ("sliding", sliding)):
        _assert_firings(name, read_committed_output(out), want[name], late_firings=True)


def _chunks(tmp: Path, checkpoint_id: int, uid: str) -> int:
    """The appended chunks of ``uid``'s windows in checkpoint ``checkpoint_id``."""
    checkpoint = read_checkpoint(tmp / "ckpt" / f"chk-{checkpoint_id:010d}")
    handles = [st["keyed"] for st in checkpoint.subtask_states(uid).values() if st.get("keyed")]
    backend = LmdbStateBackend(
        operator_uid=uid,
        subtask_index=0,
        key_group_range=KeyGroupRange(0, checkpoint.max_parallelism - 1),
        max_parallelism=checkpoint.max_parallelism,
        local_dir=tmp / f"read-{uid}-{checkpoint_id}",
    )
    try:
        backend.restore(checkpoint.root, handles)
        appends = backend.create_state(MapStateDescriptor(WINDOW_APPENDS))
        n = 0
        for key in list(backend.keys(WINDOW_APPENDS)):
            backend.key_context.key = key
            n += len(list(appends.items()))
        return n
    finally:
        backend.close()


def _assert_firings(
    name: str,
    got: Iterable[dict[str, Any]],
    want: dict[tuple[str, int, int], list[int]],
    *,
    late_firings: bool,
) -> None:
    """Each window fired once with its ids in order; or, ``late_firings``, again per late event.

    A window's firings then hold its events so far, in arrival order: prefixes
    of its ids, each of another length (no firing twice), the last one whole.
    """
    fired: dict[tuple[str, int, int], list[list[int]]] = {}
    for r in got:
        fired.setdefault((r["k"], r["start"], r["end"]), []).append(r["ids"])
    missing = sorted(set(want) - set(fired))
    extra = sorted(set(fired) - set(want))
    assert not missing and not extra, (name, missing[:5], extra[:5])
    wrong = {}
    for w, firings in fired.items():
        ids = want[w]
        firings.sort(key=len)
        lengths = [len(f) for f in firings]
        if (
            (len(firings) > 1 and not late_firings)
            or len(set(lengths)) < len(lengths)
            or firings[-1] != ids
            or any(f != ids[: len(f)] for f in firings)
        ):
            wrong[w] = (lengths, len(ids))
    assert not wrong, (name, len(wrong), sorted(wrong.items())[:5])
