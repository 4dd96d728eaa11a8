"""errors.on_process_error wherever user code runs per record, under kill -9.

Beyond the record functions of ``test_process_errors``: the key selector (in
the shuffle, at parallelism 2), ``on_timer``, a window function, the
second input of ``connect()``, the source's timestamp assigner, the sink's
serializer and the broadcast input (at parallelism 2: every instance fails
on the record, one dead letter). ``dead_letter``: every poison record (event,
timer, window or output) reaches the dead-letter output exactly once, naming
the user function and the operator, and the job's output equals a
failure-free run's without the poison. ``fail``: the job stops naming the
function, the operator and the record. Before, these places failed the job
whatever the policy (the second input even said nothing about the record).
"""

from __future__ import annotations

import collections
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt.connectors.generator import write_generated_jsonl
from aiostream_ckpt.connectors.staging import read_committed_output
from tests.apps.poison_places import POISON_APP, WINDOW_MS
from tests.helpers import check_pv_output, cli, recount, run_app_under_kills
from tests.integration.runtime.test_process_errors import process_dead_letters

pytestmark = pytest.mark.integration

POISON_PLACES_APP = "tests.apps.poison_places"

#: where -> (parallelism, the failing user function, its operator)
PLACES = {
    "key_selector": (2, "key selector poison_key", "pv-count"),
    "timer": (1, "CountWithTimers.on_timer", "pv-count"),
    "window": (1, "Describe.process", "pv-windows"),
    "second_input": (1, None, "pv-count"),
    "timestamp_assigner": (1, "timestamp assigner poison_ts", "events"),
    "sink_serializer": (1, "serializer poison_dumps", "pv-sink"),
    "broadcast": (2, None, "pv-count"),
}


def poisoned(path: Path, events: int, poison: int, *, seed: int) -> list[dict[str, Any]]:
    """Generated page views with ``poison`` poison events, each at its neighbour's time."""
    write_generated_jsonl(path, events, seed=seed, keys=50)
    lines = path.read_bytes().splitlines()
    rng = random.Random(seed)
    added = []
    for n, at in enumerate(sorted(rng.sample(range(1, len(lines)), poison), reverse=True)):
        event = {"app_id": POISON_APP, "poison": n + 1, "ts": orjson.loads(lines[at])["ts"]}
        lines.insert(at, orjson.dumps(event))
        added.append(event)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return added


def make_inputs(tmp_path: Path, where: str, events: int, poison: int, seed: int):
    """The input files (``app.*`` settings) and the poison events, per place."""
    parallelism = PLACES[where][0]
    if where in ("second_input", "broadcast"):
        a = [tmp_path / f"in-a{i}.jsonl" for i in range(parallelism)]
        for i, path in enumerate(a):
            write_generated_jsonl(path, events, seed=seed + i, keys=50)
        b = tmp_path / "in-b.jsonl"
        added = poisoned(b, events, poison, seed=seed + 10)
        return {"input": ",".join(map(str, a)), "input_b": b}, [*a, b], added
    paths = [tmp_path / f"in-{i}.jsonl" for i in range(parallelism)]
    added = [e for i, p in enumerate(paths) for e in poisoned(p, events, poison, seed=seed + i)]
    return {"input": ",".join(map(str, paths))}, paths, added


def settings(tmp_path: Path, where: str, params: dict[str, Any]) -> list[str]:
    """The ``--set`` lines of a run with the poison in ``where``."""
    sets = {
        "app.output": tmp_path / "out",
        "app.poison_in": where,
        "checkpoint.interval": "30ms",
        **{f"app.{k}": v for k, v in params.items()},
    }
    return [f"{k}={v}" for k, v in sets.items()]


def window_counts(*paths: Path) -> collections.Counter[tuple[str, int, int]]:
    """(app_id, window start, count) of every window of the events that are not poison."""
    per: collections.Counter[tuple[str, int]] = collections.Counter()
    for path in paths:
        for line in path.read_bytes().splitlines():
            e = orjson.loads(line)
            if e["app_id"] != POISON_APP:
                per[(e["app_id"], e["ts"] - e["ts"] % WINDOW_MS)] += 1
    return collections.Counter((k, start, n) for (k, start), n in per.items())


def poison_subjects(where: str, added: list[dict[str, Any]]) -> list[Any]:
    """What each dead letter must be about, one per poison event (window: per window)."""
    if where == "timer":
        return sorted(e["ts"] for e in added)
    if where == "window":
        return sorted({e["ts"] - e["ts"] % WINDOW_MS for e in added})
    if where == "sink_serializer":  # the poison key's updates 1..n
        return list(range(1, len(added) + 1))
    return sorted(e["poison"] for e in added)


def dead_letter_subject(where: str, raw: dict[str, Any]) -> Any:
    if where == "timer":
        assert raw["key"] == POISON_APP and raw["domain"] == "event_time", raw
        return raw["timestamp"]
    if where == "window":
        assert raw["key"] == POISON_APP and raw["window"][1] - raw["window"][0] == WINDOW_MS
        return raw["window"][0]
    if where == "sink_serializer":
        assert raw["app_id"] == POISON_APP, raw
        return raw["pv"]
    return raw["poison"]


#: Events per input file, read at most RATE a second: a pass lasts >= 1.6 s, 50 checkpoint
#: intervals, on any machine. Unpaced, 60 k events went by before a fast idle machine's
#: second kill; paced, a third of them is enough (5 blocks a file: room for both kills).
EVENTS, RATE = 20_000, 12_000


@pytest.mark.parametrize("where", list(PLACES))
def test_poison_in_each_place_is_dead_lettered_once_under_kill9(tmp_path: Path, where: str) -> None:
    seed = list(PLACES).index(where)
    events = 15_000 if where == "broadcast" else EVENTS  # broadcast: 3 inputs, 2 instances
    params, paths, added = make_inputs(tmp_path, where, events, 12, seed)
    dead_letter = [
        *settings(tmp_path, where, params),
        "errors.on_process_error=dead_letter",
        f"app.rate={RATE}",
    ]
    run_app_under_kills(
        tmp_path,
        POISON_PLACES_APP,
        dead_letter,
        kills=2,
        seed=seed,
        inputs=paths,
        parallelism=PLACES[where][0],
        batch_size=256,
        max_delay_after_checkpoint=0.12,
    )
    if where == "window":
        got = collections.Counter(
            (r["app_id"], r["start"], r["n"]) for r in read_committed_output(tmp_path / "out")
        )
        assert got == window_counts(*paths)
    else:
        # the broadcast input is not counted
        expected = recount(*(paths[:-1] if where == "broadcast" else paths))
        expected.pop(POISON_APP, None)
        check = check_pv_output(tmp_path / "out", expected)
        assert check.exact, (check.duplicates, check.missing, check.gaps[:5])
    dead = process_dead_letters(tmp_path / "ckpt" / "dead-letter")
    subjects = [dead_letter_subject(where, orjson.loads(d["raw"])) for d in dead]
    assert sorted(subjects) == poison_subjects(where, added)
    _, function, uid = PLACES[where]
    for d in dead:
        assert d["origin"]["operator"] == uid, d
        assert d["origin"].get("function") == function, d
        assert d["reason"].startswith("process error: ValueError: poison"), d
        assert "Traceback" in d["traceback"], d


#: where -> what the last line of a failed job names (function, operator, record)
FAILURES = {
    "key_selector": "key selector poison_key of operator 'pv-count' failed on record {",
    "timer": "CountWithTimers.on_timer of operator 'pv-count' failed on timer {'key': 'app-poison'",
    "window": "Describe.process of operator 'pv-windows' failed on window {'key': 'app-poison'",
    "second_input": "operator 'pv-count' failed on a record {'app_id': 'app-poison', 'poison': 1",
    "timestamp_assigner": "timestamp assigner poison_ts of operator 'events' failed on record "
    "{'app_id': 'app-poison', 'poison': 1",
    "sink_serializer": "serializer poison_dumps of operator 'pv-sink' failed on record "
    "{'app_id': 'app-poison', 'pv': 1}",
    "broadcast": "operator 'pv-count' failed on a record {'app_id': 'app-poison', 'poison': 1",
}


@pytest.mark.parametrize("where", list(PLACES))
def test_poison_in_each_place_fails_the_job_by_default(tmp_path: Path, where: str) -> None:
    params, _, _ = make_inputs(tmp_path, where, 3_000, 1, seed=7)
    lines = [
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        f"job.parallelism={PLACES[where][0]}",
        "job.batch_size=256",
        *settings(tmp_path, where, params),
        "restart.strategy=none",
    ]
    r = cli("run", POISON_PLACES_APP, *(arg for line in lines for arg in ("--set", line)))
    assert r.returncode == 1, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert FAILURES[where] in last, last
    assert "ValueError: poison" in last, last
    if where == "broadcast":
        assert "in process_broadcast_element" in last, last
