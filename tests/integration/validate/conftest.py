"""Fixtures for the validator's tests: one SparkSession, and input/output built by hand.

The expected output is written here in the file sink's format, so the tests
check the validator alone, not the job.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt_dev.validate import ValidationError, get_spark, stop_spark

# Lines the job dead-letters; a blank line is skipped (neither event nor dead letter).
MALFORMED = [
    b"not json",
    b'{"app_id": "app-1", "seq": ',
    b'{"user_id": "u-1", "seq": 3}',
    b'{"app_id": 5, "seq": 3}',
    b'["app-1"]',
    b'{"app_id": "app-2"} trailing',
]


@dataclass
class Case:
    """Input files plus the correct committed output, to corrupt in tests."""

    input_paths: list[Path]
    out_dir: Path
    #: (app_id, file name, byte offset) of each valid event, in input order.
    events: list[tuple[str, str, int]]
    n_malformed: int
    #: Committed files: name -> records, in the order they are written.
    files: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def apps(self) -> set[str]:
        return {app for app, _, _ in self.events}

    def write(self) -> Case:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for p in self.out_dir.iterdir():
            p.unlink()
        for name, records in self.files.items():
            (self.out_dir / name).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
        return self

    def find(self, app: str, pv: int) -> tuple[str, int]:
        """Return (file, 0-based line) of the record ``app``/``pv``."""
        for name, records in self.files.items():
            for i, r in enumerate(records):
                if r["app_id"] == app and r["pv"] == pv:
                    return name, i
        raise KeyError((app, pv))


def build_case(
    tmp: Path,
    *,
    n_events: int = 3000,
    n_apps: int = 17,
    n_files: int = 2,
    parallelism: int = 2,
    events_per_checkpoint: int = 400,
    naming: str = "subtask_first",
    with_pos: bool = False,
    seed: int = 7,
) -> Case:
    """Write input files with some malformed lines and the exactly-once pv_count output."""
    rng = random.Random(seed)
    in_dir = tmp / "in"
    in_dir.mkdir(parents=True)
    events: list[tuple[str, str, int]] = []
    paths = []
    n_malformed = 0
    per_file = n_events // n_files
    seq = 0
    for f in range(n_files):
        path = in_dir / f"events-{f}.jsonl"
        paths.append(path)
        offset = 0
        with path.open("wb") as fh:
            for i in range(per_file):
                if i % 250 == 17:
                    bad = MALFORMED[n_malformed % len(MALFORMED)]
                    n_malformed += 1
                    fh.write(bad + b"\n")
                    offset += len(bad) + 1
                if i % 700 == 5:
                    fh.write(b"\n")
                    offset += 1
                app = f"app-{min(int(rng.expovariate(0.25)), n_apps - 1)}"
                line = orjson.dumps(
                    {
                        "app_id": app,
                        "user_id": f"u-{rng.randrange(50)}",
                        "ts": 1_700_000_000_000 + seq,
                        "seq": seq,
                    }
                )
                fh.write(line + b"\n")
                events.append((app, path.name, offset))
                offset += len(line) + 1
                seq += 1
    case = Case(paths, tmp / "out", events, n_malformed)
    counts: dict[str, int] = {}
    for idx, (app, src, off) in enumerate(events):
        counts[app] = counts.get(app, 0) + 1
        subtask = zlib.crc32(app.encode()) % parallelism
        checkpoint = idx // events_per_checkpoint + 1
        if naming == "subtask_first":
            name = f"part-{subtask:04d}-{checkpoint:010d}.jsonl"
        else:
            name = f"part-{checkpoint:010d}-{subtask:04d}.jsonl"
        record: dict[str, Any] = {"app_id": app, "pv": counts[app]}
        if with_pos:
            record["_pos"] = [str(in_dir / src), off]
        case.files.setdefault(name, []).append(record)
    return case.write()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one SparkSession of the test session.

    Started with the Kafka source and Delta Lake when they can be had, so the
    Kafka and Delta tests reuse it; if the jars can't be fetched, file tests
    still run and those tests fail on their own ``get_spark(kafka=True)`` or
    ``get_spark(delta=True)`` with the reason.
    """
    try:
        session = get_spark(kafka=True, delta=True)
    except ValidationError:
        session = get_spark()
    yield session
    stop_spark()


@pytest.fixture
def case(tmp_path: Path) -> Case:
    return build_case(tmp_path)
