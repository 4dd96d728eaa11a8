"""``apps.window_count``: an event counts when it has what its window kind needs."""

from __future__ import annotations

from pathlib import Path

import orjson

from aiostream_ckpt.connectors.staging import read_committed_output
from tests.helpers import cli


def _run(tmp_path: Path, window: str, events: list[dict[str, object]]) -> list[dict[str, object]]:
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    done = cli(
        "run",
        "apps/window_count.py",
        "--set", f"app.input={src}",
        "--set", f"app.output={tmp_path / 'out'}",
        "--set", f"app.window={window}",
        "--set", f"checkpoint.dir={tmp_path / 'ckpt'}",
        "--set", "rest.enabled=false",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return list(read_committed_output(tmp_path / "out"))


def test_sessions_count_events_without_an_app_id(tmp_path: Path) -> None:
    # sessions key on user_id: app_id is no field of theirs (it was required: 2 dead letters)
    events: list[dict[str, object]] = [
        {"user_id": "u1", "ts": 1_000},
        {"user_id": "u1", "ts": 2_000, "app_id": "a"},
        {"user_id": "u2", "ts": 3_000},
        {"user_id": "u1", "ts": 100_000, "app_id": "a"},
    ]
    out = _run(tmp_path, "session", events)
    got = sorted((r["key"], r["start"], r["end"], r["count"]) for r in out)
    assert got == [
        ("u1", 1_000, 32_000, 2),
        ("u1", 100_000, 130_000, 1),
        ("u2", 3_000, 33_000, 1),
    ]


def test_tumbling_windows_dead_letter_events_without_an_app_id(tmp_path: Path) -> None:
    events: list[dict[str, object]] = [
        {"app_id": "a", "ts": 1_000},
        {"user_id": "u1", "ts": 2_000},  # no app_id: tumbling windows key on it
        {"app_id": "a", "ts": 12_000},
    ]
    out = _run(tmp_path, "tumbling", events)
    got = sorted((r["key"], r["start"], r["count"]) for r in out)
    assert got == [("a", 0, 1), ("a", 10_000, 1)]
    assert list((tmp_path / "ckpt" / "dead-letter").iterdir())
