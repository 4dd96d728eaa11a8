from __future__ import annotations

import io
import json

from bench.soak_probe import Probe


def test_a_sample_has_the_figures_the_readme_reads() -> None:
    probe = Probe(io.StringIO(), every=1.0)
    first, second = probe.sample(0), probe.sample(1)
    assert first["VmRSS"] > 0 and first["RssAnon"] > 0 and first["blocks"] > 0
    assert "types" in first and "types" not in second  # the gc census every 10th sample
    assert first["next_checkpoint"] is None  # no job in this process
    json.dumps(first)
