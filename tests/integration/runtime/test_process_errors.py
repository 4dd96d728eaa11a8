"""errors.on_process_error: a record whose user function raises, under kill -9.

``dead_letter``: each poison record reaches the dead-letter output exactly
once (record, operator uid, traceback) and every other record is counted
exactly once - the records before the poison one in its batch are not
counted twice when the batch is finished record by record. ``fail`` (the
default) fails the job naming the error; the bound fails it too.
"""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

from aiostream_ckpt.connectors.staging import read_committed_output
from tests.helpers import check_pv_output, cli, make_pv_input, recount, run_app_under_kills

pytestmark = pytest.mark.integration

POISON_APP = "app-poison"


def poisoned_input(
    path: Path, events: int, poison: int, *, seed: int, together: bool = False
) -> Path:
    """Generated page views with ``poison`` events of their own app, spread or in a row."""
    make_pv_input(path, events, seed=seed)
    lines = path.read_bytes().splitlines()
    rng = random.Random(seed)
    where = (
        [rng.randrange(len(lines))] * poison if together else rng.sample(range(len(lines)), poison)
    )
    for n, at in enumerate(sorted(where, reverse=True)):
        lines.insert(at, orjson.dumps({"app_id": POISON_APP, "poison": n + 1}))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def args(tmp_path: Path, inp: Path | list[Path], *extra: str) -> list[str]:
    paths = inp if isinstance(inp, list) else [inp]
    sets = {
        "checkpoint.dir": tmp_path / "ckpt",
        "app.input": ",".join(map(str, paths)),
        "app.output": tmp_path / "out",
        "checkpoint.interval": "30ms",
        "job.batch_size": "256",
    }
    return [a for k, v in sets.items() for a in ("--set", f"{k}={v}")] + list(extra)


def process_dead_letters(root: Path) -> list[dict]:
    """Committed dead letters of records whose function raised, from every task's output."""
    return [
        d
        for task_dir in sorted(root.iterdir())
        for d in read_committed_output(task_dir, prefix="dead-letter")
        if "operator" in d["origin"]
    ]


def expected(*inputs: Path):
    counts = recount(*inputs)
    del counts[POISON_APP]
    return counts


@pytest.mark.parametrize("parallelism", [1, 2])
def test_poison_records_are_dead_lettered_once_under_kill9(
    tmp_path: Path, parallelism: int
) -> None:
    # At parallelism 2 the keyed operator runs in its own task, behind a shuffle.
    inputs = [
        poisoned_input(tmp_path / f"in-{i}.jsonl", 100_000, 20, seed=parallelism * 10 + i)
        for i in range(parallelism)
    ]
    poison = list(range(1, 21)) * parallelism
    run_app_under_kills(
        tmp_path,
        "tests.apps.poison_count",
        [
            f"app.input={','.join(map(str, inputs))}",
            f"app.output={tmp_path / 'out'}",
            "checkpoint.interval=30ms",
            "errors.on_process_error=dead_letter",
            # a pass >= 1.7 s, 55 checkpoint intervals, on any machine (300 k events
            # unpaced stood in for that: ~3x the CPU)
            "app.rate=60000",
        ],
        kills=2,
        seed=parallelism,
        inputs=inputs,
        parallelism=parallelism,
        batch_size=256,
        max_delay_after_checkpoint=0.12,
        timeout=240,
    )
    check = check_pv_output(tmp_path / "out", expected(*inputs))
    assert check.exact, (check.duplicates, check.missing, check.gaps[:5])
    dead = process_dead_letters(tmp_path / "ckpt" / "dead-letter")
    assert sorted(orjson.loads(d["raw"])["poison"] for d in dead) == sorted(poison)
    for d in dead:
        assert d["origin"]["operator"] == "pv-count", d
        assert d["reason"].startswith("process error: ValueError: poison event"), d
        assert "Traceback" in d["traceback"] and "process_element" in d["traceback"], d


def test_process_error_fails_the_job_by_default(tmp_path: Path) -> None:
    inp = poisoned_input(tmp_path / "in.jsonl", 5_000, 1, seed=3, together=True)
    r = cli(
        "run", "tests.apps.poison_count", *args(tmp_path, inp, "--set", "restart.strategy=none")
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert "ValueError: poison event 1" in r.stderr.strip().splitlines()[-1], r.stderr[-2000:]


def test_more_process_errors_than_the_bound_fail_the_job(tmp_path: Path) -> None:
    inp = poisoned_input(tmp_path / "in.jsonl", 5_000, 8, seed=4, together=True)
    extra = (
        "--set", "errors.on_process_error=dead_letter",
        "--set", "errors.max_process_errors_per_checkpoint=5",
    )  # fmt: skip
    r = cli("run", "tests.apps.poison_count", *args(tmp_path, inp, *extra))
    assert r.returncode == 1, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "more than 5 records failed in operator 'pv-count'" in last, last
