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


def make_pv_input(
    path: Path, events: int, *, seed: int = 0, keys: int = 200, malformed: int = 0
) -> Path:
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


def cli(
    *args: str,
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiostream_ckpt.daemon.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def cli_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "aiostream_ckpt.daemon.cli", *args]


class ScriptedSource:
    """A source the test feeds batch by batch; ``gate`` can hold the reader back.

    While the gate is closed the reader does not return, so it does not inject
    barriers either: that is how a test delays one input.
    """

    bounded = True

    def __init__(self, name: str) -> None:
        import asyncio

        self.name = name
        self.queue: asyncio.Queue[list[Any] | None] = asyncio.Queue()
        self.gate = asyncio.Event()
        self.gate.set()
        self.parked = False
        self.emitted = 0

    def create_reader(self, ctx: Any) -> Any:
        return _ScriptedReader(self)


class _ScriptedReader:
    def __init__(self, source: ScriptedSource) -> None:
        self._s = source
        self._pos = 0
        self._ended = False

    async def start(self, restored: dict[str, Any] | None) -> None:
        self._pos = int((restored or {}).get(self._s.name, 0))

    async def read_batch(self, max_records: int) -> list[Any] | None:
        import asyncio

        if not self._s.gate.is_set():
            self._s.parked = True
            await self._s.gate.wait()
            self._s.parked = False
        if self._ended:
            return None
        try:
            batch = await asyncio.wait_for(self._s.queue.get(), 0.005)
        except TimeoutError:
            return []
        if batch is None:
            self._ended = True
            return None
        self._pos += len(batch)
        self._s.emitted += len(batch)
        return batch

    def snapshot_position(self) -> dict[str, Any]:
        return {self._s.name: self._pos}

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        return None

    async def close(self) -> None:
        return None


async def wait_until(predicate: Any, *, limit: float = 10.0) -> None:
    """Yield to the loop until ``predicate()`` holds (bounded; fails loudly)."""
    import asyncio
    import time

    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {limit}s")
        await asyncio.sleep(0.001)


def read_snapshot_value(
    checkpoint: Any, uid: str, state: str, key: Any, tmp: Path, default: Any = None
) -> Any:
    """The value of keyed ``state`` for ``key`` as stored in ``checkpoint``."""
    from aiostream_ckpt.state.descriptors import ValueStateDescriptor
    from aiostream_ckpt.state.keygroups import KeyGroupRange
    from aiostream_ckpt.state.lmdb.backend import LmdbStateBackend

    handles = [st["keyed"] for st in checkpoint.subtask_states(uid).values() if st.get("keyed")]
    backend = LmdbStateBackend(
        operator_uid=uid,
        subtask_index=0,
        key_group_range=KeyGroupRange(0, 127),
        max_parallelism=checkpoint.max_parallelism,
        local_dir=tmp,
    )
    try:
        backend.restore(checkpoint.root, handles)
        value_state = backend.create_state(ValueStateDescriptor(state, default=default))
        backend.key_context.key = key
        return value_state.value()
    finally:
        backend.close()
