from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# In a process of its own: the probe finds a job by looking through the process's
# objects, and a test process (one pytest-xdist worker) may still hold the
# CheckpointCoordinator of an in-process job another test ran.
_SAMPLE = """
import io, json
from bench.soak_probe import Probe
probe = Probe(io.StringIO(), every=1.0)
print(json.dumps([probe.sample(0), probe.sample(1)]))
"""


def test_a_sample_has_the_figures_the_readme_reads() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _SAMPLE], capture_output=True, text=True, cwd=REPO, check=True
    )
    first, second = json.loads(out.stdout)
    assert first["VmRSS"] > 0 and first["RssAnon"] > 0 and first["blocks"] > 0
    assert "types" in first and "types" not in second  # the gc census every 10th sample
    assert first["next_checkpoint"] is None  # no job in this process
