"""kill -9, then a restart whose dataclass changed a field's type: refused at the restore.

``tests/apps/evolving_point.py`` keeps a ``Point`` per key. Killed after its
second durable checkpoint, the job is started again by the CLI with ``y:
float`` now ``y: str``, then with ``x: int`` now ``x: float``: each restore
fails with a StateMigrationError naming the state, the field and both
types, and commits nothing (before: the first read of a stored ``y``
failed, and the stored ``x`` silently read back as floats). Started again with
a field gained with a default, it restores and every stored point reads
back, its label the default; the committed output is exactly once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt.connectors.staging import read_committed_output
from tests.helpers import cli

pytestmark = pytest.mark.integration

EVENTS, KEYS = 20_000, 20


Run = Callable[..., tuple[int, str]]


def _runner(tmp_path: Path) -> tuple[Run, Path]:
    """Write the input; return a CLI run of the app with a variant (and env), and its output."""
    events = [{"k": f"k{i % KEYS}", "seq": i} for i in range(EVENTS)]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    out = tmp_path / "out"

    def run(variant: str, env: dict[str, str] | None = None, **more: str) -> tuple[int, str]:
        sets = {
            **{f"app.{k}": v for k, v in more.items()},
            "app.input": str(path),
            "app.output": str(out),
            "app.variant": variant,
            "app.rate": "20000",  # a pass lasts >= 1 s: the kill falls mid-input
            "checkpoint.dir": str(tmp_path / "ckpt"),
            "checkpoint.interval": "20ms",
            "job.batch_size": "128",
            "rest.enabled": "false",
            "restart.strategy": "none",
        }
        args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
        done = cli("run", "tests.apps.evolving_point", *args, env=env)
        return done.returncode, done.stderr

    return run, out


def _refused(done: tuple[int, str], message: str, out: Path, committed: list[str]) -> None:
    """The run failed with ``message`` in its log and committed nothing new."""
    code, log = done
    assert code not in (0, -9), log[-2000:]
    assert f"StateMigrationError: {message}" in log, log[-2000:]
    assert sorted(p.name for p in out.glob("part-*")) == committed


def _exactly_once(done: tuple[int, str], out: Path) -> list[dict[str, Any]]:
    """The run finished; every event's record is committed once: return them."""
    code, log = done
    assert code == 0, log[-2000:]
    records = list(read_committed_output(out))
    assert Counter(r["seq"] for r in records) == Counter(range(EVENTS))
    return records


def test_field_type_change_refused_after_kill9_and_a_grown_class_restores(tmp_path: Path) -> None:
    run, out = _runner(tmp_path)
    code, log = run("base", {"AIOSTREAM_FAILPOINTS": "metadata_durable=kill@2"})
    assert code == -9, log[-2000:]
    committed = sorted(p.name for p in out.glob("part-*"))

    for variant, field, was, now in (
        ("retyped", "y", "float", "str"),
        ("widened", "x", "int", "float"),
    ):
        message = (
            f"state 'point': its checkpoint holds Point values whose field {field!r} was "
            f"written as {was}, the job now declares {now}"
        )
        _refused(run(variant), message, out, committed)

    records = _exactly_once(run("grown"), out)
    restored = 0
    for r in sorted(records, key=lambda r: r["seq"]):
        read, seq = r["read"], r["seq"]
        if seq < KEYS:
            assert read is None, r
            continue
        assert read["x"] == seq - KEYS and read["y"] == (seq - KEYS) / 2, r
        assert read["y_type"] == "float", r
        assert read["label"] in (None, "-", "grown"), r
        restored += read["label"] == "-"
    assert restored == KEYS, restored  # each key's point from the checkpoint read back once


def test_a_dropped_field_brought_back_required_is_refused_after_kill9(tmp_path: Path) -> None:
    """Fails on the code before (restored, then the first read of a point written
    without y failed). Killed in a run that dropped ``y`` (having rewritten every
    point without it), the job started with ``y`` required again is refused at the
    restore, naming the state, class and field; with ``y`` defaulted it restores."""
    run, out = _runner(tmp_path)
    kill = {"AIOSTREAM_FAILPOINTS": "metadata_durable=kill@2"}
    for variant in ("base", "dropped"):
        code, log = run(variant, kill)
        assert code == -9, log[-2000:]
    committed = sorted(p.name for p in out.glob("part-*"))
    message = (
        "state 'point': its checkpoint holds Point values some without field 'y', which "
        "the job now declares with no default"
    )
    _refused(run("base"), message, out, committed)
    records = _exactly_once(run("defaulted"), out)
    defaulted = [r for r in records if r["read"] and r["read"]["y"] == 0.0 and r["read"]["x"]]
    assert len(defaulted) == KEYS, defaulted  # each key's point written without y, read once


def test_a_key_type_change_is_refused_after_kill9_and_a_widened_one_restores(
    tmp_path: Path,
) -> None:
    """Fails on the code before (the str run restored, found no stored point under
    "3" for the stored 3 and started every key empty). Killed under key_type=int,
    the job started with key_type=str is refused at the restore, naming the
    operator and both types; with int | None it restores every key's point."""
    run, out = _runner(tmp_path)
    code, log = run("base", {"AIOSTREAM_FAILPOINTS": "metadata_durable=kill@2"}, key="int")
    assert code == -9, log[-2000:]
    committed = sorted(p.name for p in out.glob("part-*"))
    message = (
        "operator 'track': its checkpoint holds keys written as int, the job now declares "
        "key_type str"
    )
    _refused(run("base", key="str"), message, out, committed)
    records = _exactly_once(run("base", key="int?"), out)
    assert sum(r["read"] is None for r in records) == KEYS  # no key restored empty


def test_undeclared_int_keys_declared_str_are_refused_after_kill9_and_int_restores(
    tmp_path: Path,
) -> None:
    """Fails on the code before (the str run restored, looked up "3" where 3 was
    stored, started every key empty and finished). Killed with undeclared int
    keys, the job started with key_type=str is refused at the restore (its
    stored keys are scanned: their kinds were not recorded), naming the
    operator, the type and a stored key; with key_type=int every key's point
    restores and the output is exactly once."""
    run, out = _runner(tmp_path)
    code, log = run("base", {"AIOSTREAM_FAILPOINTS": "metadata_durable=kill@2"}, key="n")
    assert code == -9, log[-2000:]
    committed = sorted(p.name for p in out.glob("part-*"))
    code, log = run("base", key="str")
    assert code not in (0, -9), log[-2000:]
    assert (
        "StateMigrationError: operator 'track': its checkpoint holds keys written without "
        "a key_type, the job now declares key_type str, which a stored key does not fit"
    ) in log, log[-2000:]
    assert sorted(p.name for p in out.glob("part-*")) == committed
    code, log = run("base", key="int")
    assert code == 0, log[-2000:]
    records = list(read_committed_output(out))
    assert Counter(r["seq"] for r in records) == Counter(range(EVENTS))  # exactly once
    assert sum(r["read"] is None for r in records) == KEYS  # no key restored empty
