"""kill -9 under an interval join: kept records and cleanup timers restore, pairs exactly once."""

from __future__ import annotations

import bisect
import collections
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt.connectors.staging import read_committed_output
from tests.apps.interval_pairs import LOWER, UPPER
from tests.helpers import DaemonProcess, in_flight_records, run_app_under_kills

pytestmark = pytest.mark.integration

#: Events per side, read at most RATE a second: a pass lasts >= 2 s, 40 checkpoint intervals,
#: on any machine (150 k unpaced stood in for that); still > 10 k pairs.
EVENTS, RATE = 80_000, 40_000


def _write(path: Path, side: str, n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    ts, rows = 0, []
    for i in range(n):
        ts += rng.randint(0, 10)
        rows.append({"id": f"{side}{i}", "k": f"u{rng.randrange(60)}", "ts": ts})
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return rows


def _expected(left: list[Any], right: list[Any]) -> collections.Counter[tuple[str, str, str]]:
    by_key: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    for r in right:
        by_key[r["k"]].append((r["ts"], r["id"]))
    pairs: collections.Counter[tuple[str, str, str]] = collections.Counter()
    for a in left:
        rs = by_key[a["k"]]
        lo = bisect.bisect_left(rs, (a["ts"] + LOWER, ""))
        for ts, rid in rs[lo:]:
            if ts > a["ts"] + UPPER:
                break
            pairs[(a["k"], a["id"], rid)] += 1
    return pairs


def _committed(out: Path) -> collections.Counter[tuple[str, str, str]]:
    return collections.Counter((r["k"], r["l"], r["r"]) for r in read_committed_output(out))


def _args(tmp: Path, p: int) -> list[str]:
    return [
        "run", "tests.apps.interval_pairs",
        "--set", f"checkpoint.dir={tmp / 'ckpt'}",
        "--set", f"app.left={tmp / 'left.jsonl'}",
        "--set", f"app.right={tmp / 'right.jsonl'}",
        "--set", f"app.output={tmp / 'out'}",
        "--set", f"app.rate={RATE}",
        "--set", "checkpoint.interval=50ms",
        "--set", f"job.parallelism={p}",
        "--set", "job.batch_size=256",
        "--set", "rest.enabled=false",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "extra",
    [
        [],
        # unaligned at two workers: the join's keyed channels cross the processes, and each
        # checkpoint's barriers overtake records (and watermarks) in flight on them
        ["checkpoint.unaligned=true", "job.workers=2", "restart.delay=0s"],
    ],
    ids=["aligned", "unaligned-workers"],
)
def test_interval_join_exactly_once_under_kill9(tmp_path: Path, extra: list[str]) -> None:
    left = _write(tmp_path / "left.jsonl", "l", EVENTS, seed=1)
    right = _write(tmp_path / "right.jsonl", "r", EVENTS, seed=2)
    _, log = run_app_under_kills(
        tmp_path,
        "tests.apps.interval_pairs",
        [
            f"app.left={tmp_path / 'left.jsonl'}",
            f"app.right={tmp_path / 'right.jsonl'}",
            f"app.output={tmp_path / 'out'}",
            f"app.rate={RATE}",
            *extra,
        ],
        kills=2,
        seed=3,
        inputs=[tmp_path / "left.jsonl", tmp_path / "right.jsonl"],
        parallelism=2,
        batch_size=256,
        max_delay_after_checkpoint=0.12,
        kill_workers=bool(extra),
    )
    expected = _expected(left, right)
    assert sum(expected.values()) > 10_000
    assert _committed(tmp_path / "out") == expected
    if extra:
        assert in_flight_records(log.read_text()), "no checkpoint held in-flight records"


def test_killed_at_parallelism_2_resumed_at_3(tmp_path: Path) -> None:
    left = _write(tmp_path / "left.jsonl", "l", EVENTS, seed=4)
    right = _write(tmp_path / "right.jsonl", "r", EVENTS, seed=5)
    with DaemonProcess(*_args(tmp_path, 2)) as first:
        first.wait_for("checkpoint 3 completed", timeout=120)
        first.proc.kill()  # SIGKILL
        first.proc.wait()
    expected = _expected(left, right)
    assert _committed(tmp_path / "out") != expected  # it was cut short
    with DaemonProcess(*_args(tmp_path, 3)) as second:
        assert second.wait(timeout=300) == 0, second.stderr[-3000:]
        assert "restoring from checkpoint" in second.stderr
    assert _committed(tmp_path / "out") == expected
