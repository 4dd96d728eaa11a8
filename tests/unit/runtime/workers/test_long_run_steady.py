"""A job's checkpoints leave nothing growing: no new interned names, no new threads.

The soak (``python -m bench --soak``, bench/README.md) showed pv_count's RSS
step twice after its warm-up: when the interned-string table resized
(pathlib interned every checkpoint's new file names) and when the loop's
default executor started a thread as two sink writes first overlapped. Here
pv_count's shape (keyed count in LMDB, exactly-once file sink) runs
checkpoint after checkpoint in-process, and the checks are exact, not timed.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink
from aiostream_ckpt.durable import child_path
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.runtime.workers.attempt import AttemptThreads
from aiostream_ckpt.testing import Checkpoint, ScriptedSource, run_job_async
from apps.pv_count import CountPageViews

WARM = 10  # checkpoints before the first look
CHECKPOINTS = 40


class Probe:
    """What the process holds at two points of the job: at the start, after warm-up, at the end."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.before = {t.ident for t in threading.enumerate()}
        self.threads: dict[str, list[str]] = {}
        #: strings pathlib (or anything else) asked to intern, per phase
        self.interned: dict[str, set[str]] = {"warm-up": set(), "after": set()}
        self.phase = "warm-up"
        intern = sys.intern

        def counting(s: str) -> str:
            self.interned[self.phase].add(s)
            return intern(s)

        monkeypatch.setattr(sys, "intern", counting)

    def look(self, event: dict[str, Any]) -> dict[str, Any]:
        seq = event["seq"]
        if seq in (0, WARM, CHECKPOINTS - 1):
            names = [t.name for t in threading.enumerate() if t.ident not in self.before]
            self.threads[str(seq)] = sorted(names)
        if seq == WARM:
            self.phase = "after"
        return event


async def test_checkpoints_after_warm_up_intern_no_new_names_and_start_no_threads(
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
    # Before: the snapshot pool started its threads when work first overlapped and
    # the sink's writes started the loop's default executor's, one by one.
    pools = Counter(name.rsplit("_", 1)[0] for name in probe.threads["0"])
    assert pools == {"snapshot": 2, "io": AttemptThreads.IO_THREADS}, probe.threads["0"]
    assert probe.threads[str(WARM)] == probe.threads["0"]
    assert probe.threads[str(CHECKPOINTS - 1)] == probe.threads["0"]


def test_child_path_is_the_joined_path_of_one_component(tmp_path: Path) -> None:
    assert child_path(tmp_path, "chk-0000000001") == tmp_path / "chk-0000000001"
    assert str(child_path(tmp_path, ".part.pending")) == f"{tmp_path}/.part.pending"
    for bad in ("", ".", "..", "a/b"):
        with pytest.raises(ValueError, match="single path component"):
            child_path(tmp_path, bad)
