"""kill -9 under a job with a side output from a keyed process function (``ctx.output``).

Side records travel between the same barriers as the main output, so both
committed outputs are exactly those of a failure-free run.
"""

from __future__ import annotations

import collections
from pathlib import Path

import orjson
import pytest

from aiostream_ckpt.connectors.staging import read_committed_output
from tests.helpers import check_pv_output, make_pv_input, recount, run_app_under_kills

pytestmark = pytest.mark.integration

#: Events per input, read at most RATE a second: a pass lasts >= 1.7 s, 34 checkpoint
#: intervals, on any machine (300 k unpaced stood in for that: ~4x the CPU).
EVENTS, RATE = 100_000, 60_000


@pytest.mark.parametrize("parallelism", [1, 2])
def test_side_output_exactly_once_under_kill9(tmp_path: Path, parallelism: int) -> None:
    inputs = [
        make_pv_input(tmp_path / f"in-{i}.jsonl", EVENTS, seed=40 + i, malformed=1)
        for i in range(parallelism)
    ]
    out, side = tmp_path / "out", tmp_path / "side"
    run_app_under_kills(
        tmp_path,
        "tests.apps.side_sample",
        [
            f"app.input={','.join(map(str, inputs))}",
            f"app.output={out}",
            f"app.side_output={side}",
            f"app.rate={RATE}",
        ],
        kills=2,
        seed=parallelism,
        inputs=inputs,
        parallelism=parallelism,
        max_delay_after_checkpoint=0.12,
    )
    check = check_pv_output(out, recount(*inputs))
    assert check.exact, (check.duplicates, check.missing, check.gaps[:5])
    want = collections.Counter()
    for path in inputs:
        for line in path.read_bytes().splitlines():
            try:
                e = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if e["seq"] % 10 == 0:
                want[(e["seq"], e["app_id"])] += 1
    got = collections.Counter((r["seq"], r["app_id"]) for r in read_committed_output(side))
    assert got == want, (sum((got - want).values()), sum((want - got).values()))
