"""kill -9 under the fraud-rules app: broadcast state, keyed state, timers and map_async.

The rules are a few dozen lines, read and broadcast long before the kills: after
a restore they come back only from the checkpoint's broadcast state (the rules
source resumes at its end). Missing or partial broadcast state in any instance
changes which transactions alert, so comparing with the app's oracle (the
output recomputed without the engine) checks the restore, and exactly-once.
"""

from __future__ import annotations

import collections
from pathlib import Path

import orjson
import pytest

from aiostream_ckpt.connectors.staging import read_committed_output
from apps.fraud_rules import expected_output, write_inputs
from tests.helpers import DaemonProcess, in_flight_records, run_app_under_kills

pytestmark = pytest.mark.integration

#: Transactions, read at most RATE a second: a pass lasts >= 2 s, 40 checkpoint intervals, on
#: any machine (120 k unpaced stood in for that).
EVENTS, RATE = 60_000, 30_000


def _args(tmp: Path, txns: Path, rules: Path, parallelism: int) -> list[str]:
    return [
        "run", "apps.fraud_rules",
        "--set", f"checkpoint.dir={tmp / 'ckpt'}",
        "--set", f"app.transactions={txns}",
        "--set", f"app.rules={rules}",
        "--set", f"app.output={tmp / 'out'}",
        "--set", f"app.rate={RATE}",
        "--set", "checkpoint.interval=50ms",
        "--set", f"job.parallelism={parallelism}",
        "--set", "job.batch_size=256",
        "--set", "rest.enabled=false",
    ]  # fmt: skip


def _diff(tmp: Path, txns: Path, rules: Path) -> tuple[int, int, int]:
    """Return (records, unexpected, missing) of the committed output against the oracle."""

    def canon(rows: object) -> collections.Counter[bytes]:
        return collections.Counter(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) for r in rows)  # type: ignore[attr-defined]

    got = canon(read_committed_output(tmp / "out"))
    want = canon(expected_output({"transactions": str(txns), "rules": str(rules)}))
    return sum(got.values()), sum((got - want).values()), sum((want - got).values())


@pytest.mark.parametrize(
    "extra",
    [
        [],
        # unaligned at two workers: transactions and rules in flight to the broadcast
        # operator, across the workers' socket, and the lookups in flight in map_async
        ["checkpoint.unaligned=true", "job.workers=2", "restart.delay=0s"],
    ],
    ids=["aligned", "unaligned-workers"],
)
def test_fraud_rules_exactly_once_under_kill9(tmp_path: Path, extra: list[str]) -> None:
    txns, rules = write_inputs(tmp_path / "in", EVENTS, seed=11)
    _, log = run_app_under_kills(
        tmp_path,
        "apps.fraud_rules",
        [
            f"app.transactions={txns}",
            f"app.rules={rules}",
            f"app.output={tmp_path / 'out'}",
            f"app.rate={RATE}",
            *extra,
        ],
        kills=2,
        seed=5,
        inputs=[txns],
        parallelism=2,
        batch_size=256,
        max_delay_after_checkpoint=0.12,
        kill_workers=bool(extra),
    )
    assert _diff(tmp_path, txns, rules) == (EVENTS, 0, 0)
    if extra:
        assert in_flight_records(log.read_text()), "no checkpoint held in-flight records"


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 1)])
def test_broadcast_state_restored_into_every_instance_at_another_parallelism(
    tmp_path: Path, before: int, after: int
) -> None:
    txns, rules = write_inputs(tmp_path / "in", EVENTS, seed=12)
    with DaemonProcess(*_args(tmp_path, txns, rules, before)) as first:
        first.wait_for("checkpoint 3 completed", timeout=120)
        first.proc.kill()  # SIGKILL
        first.proc.wait()
    _, _, missing = _diff(tmp_path, txns, rules)
    assert missing > 0, "the first run was not cut short"
    with DaemonProcess(*_args(tmp_path, txns, rules, after)) as second:
        assert second.wait(timeout=300) == 0, second.stderr[-3000:]
        assert "restoring from checkpoint" in second.stderr
    assert _diff(tmp_path, txns, rules) == (EVENTS, 0, 0)
