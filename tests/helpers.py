"""Helpers shared by the test tiers: inputs, recounts, running the CLI."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt.connectors.generator import write_generated_jsonl
from aiostream_ckpt.connectors.staging import read_committed_output

REPO = Path(__file__).resolve().parent.parent


def make_pv_input(path: Path, events: int, *, seed: int = 0, keys: int = 200,
                  malformed: int = 0) -> Path:
    write_generated_jsonl(path, events, seed=seed, keys=keys)
    if malformed:
        with open(path, "ab") as f:
            for i in range(malformed):
                f.write(b'{"app_id": broken %d\n' % i)
    return path


def recount(*paths: Path) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for path in paths:
        with open(path, "rb") as f:
            for line in f:
                try:
                    event = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                counts[event["app_id"]] += 1
    return counts


@dataclass
class PvCheck:
    records: int
    duplicates: int
    missing: int
    gaps: list[Any]
    final: dict[str, int]

    @property
    def exact(self) -> bool:
        return not self.duplicates and not self.missing and not self.gaps


def check_pv_output(output_dir: Path, expected: collections.Counter[str]) -> PvCheck:
    """Compare committed pv_count output with a recount: per key exactly 1..n."""
    seen: dict[str, list[int]] = collections.defaultdict(list)
    records = 0
    for rec in read_committed_output(output_dir):
        records += 1
        seen[rec["app_id"]].append(rec["pv"])
    duplicates = missing = 0
    gaps = []
    for key in set(seen) | set(expected):
        values = seen.get(key, [])
        want = expected.get(key, 0)
        distinct = set(values)
        duplicates += len(values) - len(distinct)
        lost = set(range(1, want + 1)) - distinct
        missing += len(lost)
        if lost:
            gaps.append((key, sorted(lost)[:5]))
    final = {k: max(v) for k, v in seen.items() if v}
    return PvCheck(records, duplicates, missing, gaps, final)


def cli(*args: str, timeout: float = 120, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiostream_ckpt.daemon.cli", *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def cli_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "aiostream_ckpt.daemon.cli", *args]
