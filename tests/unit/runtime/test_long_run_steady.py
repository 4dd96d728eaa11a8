"""A job's checkpoints leave nothing growing: no new interned names.

The soak (``python -m bench --soak``, bench/README.md) showed pv_count's RSS
step after its warm-up when the interned-string table resized (pathlib
interned every checkpoint's new file names). Here pv_count's shape (keyed
count in LMDB, exactly-once file sink) runs checkpoint after checkpoint
in-process, and the checks are exact, not timed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink
from aiostream_ckpt.durable import child_path
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.testing import Checkpoint, ScriptedSource, run_job_async
from apps.pv_count import CountPageViews

WARM = 10  # checkpoints before the first look
CHECKPOINTS = 40


class Probe:
    """What the job asks to intern before and after its warm-up."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        #: strings pathlib (or anything else) asked to intern, per phase
        self.interned: dict[str, set[str]] = {"warm-up": set(), "after": set()}
        self.phase = "warm-up"
        intern = sys.intern

        def counting(s: str) -> str:
            self.interned[self.phase].add(s)
            return intern(s)

        monkeypatch.setattr(sys, "intern", counting)

    def look(self, event: dict[str, Any]) -> dict[str, Any]:
        if event["seq"] == WARM:
            self.phase = "after"
        return event


async def test_checkpoints_after_warm_up_intern_no_new_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = Probe(monkeypatch)
    script: list[Any] = []
    for seq in range(CHECKPOINTS):
        script += [{"app_id": f"app-{k}", "seq": seq} for k in range(5)]
        script.append(Checkpoint())
    config = JobConfig(parallelism=1).with_checkpoint_dir(tmp_path / "ckpt")
    env = StreamEnvironment("pv", config=config)
    counts = (
        env.from_source(ScriptedSource(script), uid="events")
        .map(probe.look, uid="probe")
        .key_by(lambda e: e["app_id"])
        .process(CountPageViews(), uid="pv-count")
    )
    counts.sink_to(ExactlyOnceFileSink(tmp_path / "out"), uid="pv-sink")

    result = await run_job_async(env, {}, restarts=0, checkpoint_interval=0.001)

    assert result.last_checkpoint is not None and result.last_checkpoint >= CHECKPOINTS
    # Before: chk-N, .part-...-N.inprogress/.pending, part-N-0000.jsonl and the
    # snapshot's ...-N-...-delta.bin were interned anew at every checkpoint.
    new = probe.interned["after"] - probe.interned["warm-up"]
    assert not new, sorted(new)[:10]


def test_child_path_is_the_joined_path_of_one_component(tmp_path: Path) -> None:
    assert child_path(tmp_path, "chk-0000000001") == tmp_path / "chk-0000000001"
    assert str(child_path(tmp_path, ".part.pending")) == f"{tmp_path}/.part.pending"
    for bad in ("", ".", "..", "a/b"):
        with pytest.raises(ValueError, match="single path component"):
            child_path(tmp_path, bad)
