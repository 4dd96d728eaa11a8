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
from aiostream_ckpt_dev.chaos.kills import run_with_kills
from tests.helpers import REPO, check_pv_output, cli_cmd, make_pv_input, recount

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("parallelism", [1, 2])
def test_side_output_exactly_once_under_kill9(tmp_path: Path, parallelism: int) -> None:
    inputs = [
        make_pv_input(tmp_path / f"in-{i}.jsonl", 300_000, seed=40 + i, malformed=1)
        for i in range(parallelism)
    ]
    out, side = tmp_path / "out", tmp_path / "side"
    cmd = cli_cmd(
        "run", "tests.apps.side_sample",
        "--set", f"checkpoint.dir={tmp_path / 'ckpt'}",
        "--set", f"app.input={','.join(map(str, inputs))}",
        "--set", f"app.output={out}",
        "--set", f"app.side_output={side}",
        "--set", "checkpoint.interval=50ms",
        "--set", f"job.parallelism={parallelism}",
        "--set", "job.batch_size=512",
    )  # fmt: skip
    log = tmp_path / "worker.log"
    result = run_with_kills(
        cmd, kills=2, seed=parallelism, max_delay_after_checkpoint=0.12, timeout=300,
        log_path=log, cwd=REPO, inputs=inputs,
    )  # fmt: skip
    assert result.exit_code == 0, log.read_text()[-4000:]
    assert result.kills == 2, log.read_text()[-3000:]
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
