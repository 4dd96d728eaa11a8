"""Every entry point runs with the process profile, not only the CLI (issue 17, item 4).

Each check runs in a fresh interpreter: the profile is process-wide and applied once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from aiostream_ckpt.runtime.process import ProcessProfile

#: A script that runs a small job with ``env.execute()`` and reports the knobs before and after.
_SCRIPT = """
import gc, json, sys
from pathlib import Path
from aiostream_ckpt.api.environment import StreamEnvironment
from aiostream_ckpt.connectors.collection import CollectSink
from aiostream_ckpt.jobspec.config import JobConfig

def knobs():
    return {"gc0": gc.get_threshold()[0], "switch": sys.getswitchinterval(),
            "frozen": gc.get_freeze_count()}

before = knobs()
env = StreamEnvironment("profile", config=JobConfig().with_checkpoint_dir(Path(sys.argv[1])))
sink = CollectSink()
env.from_collection(range(10)).map(lambda x: x * 2).sink_to(sink)
env.execute()
after = knobs()
env2 = StreamEnvironment("again", config=JobConfig().with_checkpoint_dir(Path(sys.argv[2])))
env2.from_collection(range(3)).sink_to(CollectSink())
gc.set_threshold(123)  # changed by hand after the first job: a second job leaves it
sys.setswitchinterval(0.01)
env2.execute()
print(json.dumps({"before": before, "after": after, "results": sorted(sink.results),
                  "second": knobs()}))
"""


def test_env_execute_applies_the_process_profile(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path / "a"), str(tmp_path / "b")],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    out = json.loads(done.stdout)
    profile = ProcessProfile()
    assert out["before"]["gc0"] == 700  # Python's defaults until a job runs
    assert out["before"]["switch"] == 0.005
    assert out["before"]["frozen"] == 0
    assert out["results"] == [x * 2 for x in range(10)]
    assert out["after"]["gc0"] == profile.gc_threshold
    assert out["after"]["switch"] == profile.switch_interval
    assert out["after"]["frozen"] > 0  # startup objects frozen out of GC
    # once per process: the second job does not apply (or freeze) again
    assert out["second"]["gc0"] == 123
    assert out["second"]["switch"] == 0.01


#: A worker process (``job.workers`` > 1) builds the job as the CLI does, from the same
#: config sources; here with a ``process.*`` key set, as ``--set`` passes it on.
_WORKER = """
import gc, json, sys
from aiostream_ckpt.daemon.worker import build_job
before = gc.get_threshold()[0]
build_job("profile_app", None, ["process.gc_threshold=12345", "process.switch_interval=0.002"])
print(json.dumps({"before": before, "gc0": gc.get_threshold()[0],
                  "switch": sys.getswitchinterval(), "frozen": gc.get_freeze_count()}))
"""


def test_a_worker_process_applies_the_process_profile_of_its_config(tmp_path: Path) -> None:
    """The job runner applies the profile in the main process only: workers ran without it."""
    (tmp_path / "profile_app.py").write_text(
        "def build(env):\n    env.from_collection([1]).print()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", _WORKER],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])},
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["before"] == 700
    assert (out["gc0"], out["switch"]) == (12345, 0.002)
    assert out["frozen"] > 0
