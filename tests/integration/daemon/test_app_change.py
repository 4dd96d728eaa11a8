"""Restore a savepoint into changed app code: state is matched by operator uid.

Kept operators continue from their savepoint state (their output stays
exactly the failure-free one); new operators start empty; state of operators
the job no longer has is an error unless ``--allow-non-restored-state``.
"""

from __future__ import annotations

import collections
import shutil
from pathlib import Path

import pytest

from aiostream_ckpt.checkpoint.storage import read_checkpoint
from aiostream_ckpt.connectors.generator import GeneratorSource
from tests.helpers import DaemonProcess, check_pv_output, cli

pytestmark = pytest.mark.integration

TOKEN = "app-change-token"
EVENTS, KEYS, USERS = 40_000, 100, 500


def args(tmp_path: Path, run: str, variant: str, *extra: str) -> list[str]:
    return [
        "run",
        "tests.apps.evolving_pv",
        "--set",
        f"checkpoint.dir={tmp_path / run / 'ckpt'}",
        "--set",
        f"app.output={tmp_path / run / 'out'}",
        "--set",
        f"app.variant={variant}",
        "--set",
        f"app.generate={EVENTS}",
        "--set",
        f"app.keys={KEYS}",
        "--set",
        f"app.users={USERS}",
        "--set",
        "checkpoint.interval=100ms",
        "--set",
        "job.batch_size=256",
        *extra,
    ]


def counts(field: str, start: int = 0) -> collections.Counter[str]:
    src = GeneratorSource(EVENTS, keys=KEYS, users=USERS)
    return collections.Counter(e[field] for e in src.generate(0, start, EVENTS))


@pytest.fixture(scope="module")
def savepoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """Base variant stopped with a savepoint mid-run: (work dir, savepoint, position)."""
    tmp = tmp_path_factory.mktemp("evolve")
    live = args(tmp, "base", "base", "--set", "app.rate=5000", "--set", "rest.port=0")
    with DaemonProcess(*live, env={"AIOSTREAM_REST__TOKEN": TOKEN}) as d:
        d.wait_for("checkpoint 3 completed")
        status, sp = d.request("POST", "/job/stop-with-savepoint", token=TOKEN)
        assert status == 200, sp
        assert d.wait() == 0, d.stderr[-3000:]
    path = Path(sp["path"])
    (st,) = read_checkpoint(path).subtask_states("events").values()
    position = int(st["operator"]["positions"]["split-0"])
    assert 0 < position < EVENTS
    return tmp, path, position


def restore(tmp: Path, savepoint: Path, run: str, variant: str, *extra: str) -> str:
    shutil.copytree(tmp / "base" / "out", tmp / run / "out")
    r = cli(
        *args(tmp, run, variant, "--set", "rest.enabled=false", *extra),
        "--from-savepoint",
        str(savepoint),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stderr


def test_added_operator_starts_empty_and_kept_state_is_intact(
    savepoint: tuple[Path, Path, int],
) -> None:
    tmp, path, position = savepoint
    restore(tmp, path, "added", "added")
    out = tmp / "added" / "out"
    assert check_pv_output(out / "pv", counts("app_id")).exact
    assert check_pv_output(out / "users", counts("user_id")).exact
    new = check_pv_output(out / "new", counts("app_id", position))
    assert new.exact and new.records == EVENTS - position


def test_renamed_operator_needs_allow_non_restored_state(
    savepoint: tuple[Path, Path, int],
) -> None:
    tmp, path, position = savepoint
    r = cli(*args(tmp, "refused", "renamed"), "--from-savepoint", str(path))
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert "has state for operators not in the job: user-count, user-sink" in last, last
    assert "--allow-non-restored-state" in last

    stderr = restore(tmp, path, "renamed", "renamed", "--allow-non-restored-state")
    sp_id = read_checkpoint(path).checkpoint_id
    assert (
        f"--allow-non-restored-state: dropping the state of savepoint {sp_id} for operator(s) "
        "not in the job: user-count, user-sink"
    ) in stderr
    out = tmp / "renamed" / "out"
    assert check_pv_output(out / "pv", counts("app_id")).exact  # kept: continues from its state
    users2 = check_pv_output(out / "users2", counts("user_id", position))  # new uid: from 0
    assert users2.exact and users2.records == EVENTS - position


def test_checkpoints_list_shows_the_savepoints(savepoint: tuple[Path, Path, int]) -> None:
    tmp, path, _ = savepoint
    r = cli("checkpoints", "list", str(tmp / "base" / "ckpt"))
    assert r.returncode == 0, r.stderr
    (row,) = [line for line in r.stdout.splitlines() if "savepoint" in line]
    assert row.split()[0] == str(read_checkpoint(path).checkpoint_id)
    assert row.endswith(f"savepoint {path}")
    assert path.name.startswith("savepoint-evolving_pv-")
