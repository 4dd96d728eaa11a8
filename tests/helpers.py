"""Helpers shared by the test tiers: inputs, recounts, running the CLI."""

from __future__ import annotations

import collections
import os
import re
import struct
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt.checkpoint.config import CheckpointConfig
from aiostream_ckpt.checkpoint.coordinator import CheckpointCoordinator
from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.checkpoint.storage import CheckpointStorage
from aiostream_ckpt.clock import Clock
from aiostream_ckpt.connectors.generator import write_generated_jsonl
from aiostream_ckpt.connectors.staging import read_committed_output
from aiostream_ckpt_dev.chaos.kills import ChaosResult, run_with_kills
from aiostream_ckpt_dev.recount import recount_inputs
from aiostream_ckpt_dev.validate.tables import table_records

REPO = Path(__file__).resolve().parent.parent


def job_coordinator(
    storage: CheckpointStorage,
    clock: Clock,
    executor: Executor,
    config: CheckpointConfig | None = None,
) -> CheckpointCoordinator:
    """A coordinator with no task yet: what a ``WorkerGroup`` registers its workers' tasks with."""
    return CheckpointCoordinator(
        job_name="pv_count",
        config=config or CheckpointConfig(),
        storage=storage,
        clock=clock,
        executor=executor,
        max_parallelism=128,
        first_checkpoint_id=1,
    )


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
    """Valid events per app_id (the job's rule: a JSON object with a string app_id)."""
    return recount_inputs(paths)[0]


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
    """Compare committed pv_count output with a recount: per key exactly 1..n.

    A Delta table or a Parquet directory is read as its readers see it.
    """
    seen: dict[str, list[int]] = collections.defaultdict(list)
    records = 0
    table = table_records(output_dir)
    committed = (r for r, _ in table) if table is not None else read_committed_output(output_dir)
    for rec in committed:
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


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie nobody reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def pids_with(marker: str) -> list[int]:
    """The processes whose command line holds ``marker`` (left-over workers, by their paths)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def newest_checkpoint(ckpt: Path) -> int:
    """The id a restart on ``ckpt`` restores: its newest completed checkpoint on disk.

    What a test killed "after checkpoint N" restores from is this, not N: the
    job may complete another one before the kill lands (a loaded machine).
    """
    newest = next(CheckpointStorage(ckpt, create=False).completed_newest_first(), None)
    assert newest is not None, f"no completed checkpoint in {ckpt}"
    return newest


def cli_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "aiostream_ckpt.daemon.cli", *args]


def run_app_under_kills(
    tmp_path: Path,
    app: str,
    settings: Sequence[str],
    *,
    kills: int,
    seed: int,
    at_least: int | None = None,
    inputs: Sequence[Path] | None = None,
    parallelism: int | Sequence[int] = 1,
    batch_size: int = 512,
    max_delay_after_checkpoint: float = 1.0,
    timeout: float = 300,
    kill_workers: bool = False,
    hang_workers: bool = False,
) -> tuple[ChaosResult, Path]:
    """Run ``aiostream-ckpt run APP`` to the end under ``kills`` kill -9; return it and its log.

    Checkpoints every 50 ms in ``tmp_path/ckpt``, with no REST server (nothing
    queries it, and each start would pay ~0.45 s of CPU for it); ``settings`` are
    ``KEY=VALUE`` (``--set``) lines: the app's own, or one of these defaults overridden.
    With ``inputs`` the kills fall at fractions of them, else after
    checkpoints. Asserts the worker finished and was killed ``kills`` times,
    or ``at_least`` times where a kill may find the job done. A sequence of
    ``parallelism`` gives each run its own (restored at another: a rescale),
    the last one for the runs past it.
    """
    sets = {
        "checkpoint.dir": str(tmp_path / "ckpt"),
        "checkpoint.interval": "50ms",
        "job.batch_size": str(batch_size),
        "rest.enabled": "false",
    }
    for line in settings:
        key, _, value = line.partition("=")
        sets[key] = value
    each = [parallelism] if isinstance(parallelism, int) else list(parallelism)

    def cmd(run: int) -> list[str]:
        run_sets = {"job.parallelism": str(each[min(run, len(each)) - 1]), **sets}
        return cli_cmd("run", app, *(a for k, v in run_sets.items() for a in ("--set", f"{k}={v}")))

    log = tmp_path / "worker.log"
    result = run_with_kills(
        cmd,
        kills=kills,
        seed=seed,
        max_delay_after_checkpoint=max_delay_after_checkpoint,
        timeout=timeout,
        log_path=log,
        cwd=REPO,
        inputs=inputs,
        kill_workers=kill_workers,
        hang_workers=hang_workers,
    )
    assert result.exit_code == 0, log.read_text()[-4000:]
    outran = f"{result.kills} of {kills} kills: the job outran them (pace its input?)\n"
    if at_least is None:
        assert result.kills == kills, outran + log.read_text()[-3000:]
    else:
        assert result.kills >= at_least, outran + log.read_text()[-3000:]
    return result, log


_IN_FLIGHT = re.compile(r"checkpoint \d+ completed .*; unaligned, (\d+) in-flight records")


def in_flight_records(log: str) -> int:
    """The most in-flight records one unaligned checkpoint of ``log`` persisted (0: none)."""
    return max((int(n) for n in _IN_FLIGHT.findall(log)), default=0)


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
        # poll rather than wait_for: on 3.11 wait_for can swallow a cancellation
        # that races with the get() finishing
        try:
            batch = self._s.queue.get_nowait()
        except asyncio.QueueEmpty:
            await asyncio.sleep(0.002)
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


def generated_counts(
    events: int, *, splits: int = 1, seed: int = 0, keys: int = 1000
) -> collections.Counter[str]:
    """Per-key counts of ``GeneratorSource(events, splits=...)`` (what pv_count must reach)."""
    from aiostream_ckpt.connectors.generator import GeneratorSource

    src = GeneratorSource(events, seed=seed, keys=keys, splits=splits)
    counts: collections.Counter[str] = collections.Counter()
    for s in range(splits):
        counts.update(e["app_id"] for e in src.generate(s, 0, src.split_length(s) or 0))
    return counts


class DaemonProcess:
    """``aiostream-ckpt run ...`` in a child process with its REST API on a free port.

    Collects stderr in a thread; :meth:`wait_for` blocks until a line matches.
    Use as a context manager: the child is killed if the test leaves early.
    """

    def __init__(self, *args: str, env: dict[str, str] | None = None, command: Any = None) -> None:
        import re
        import threading

        cmd = list(command) if command is not None else cli_cmd(*args)
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._port_re = re.compile(r"REST API listening on http://([^:]+):(\d+)")
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.lines.append("")  # EOF marker for waiters
            self._cond.notify_all()

    @property
    def stderr(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 60) -> str:
        """The first stderr line containing ``pattern`` (AssertionError if the child ends first)."""
        import time

        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    if pattern in line:
                        return line
                seen = len(self.lines)
                if self.proc.poll() is not None and self.lines and self.lines[-1] == "":
                    raise AssertionError(f"child ended before {pattern!r}:\n{self.stderr[-3000:]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"no {pattern!r} within {timeout}s:\n{self.stderr[-3000:]}"
                    )
                self._cond.wait(min(left, 0.2))

    @property
    def url(self) -> str:
        line = self.wait_for("REST API listening on")
        m = self._port_re.search(line)
        assert m is not None
        return f"http://127.0.0.1:{m.group(2)}"

    def request(
        self, method: str, path: str, *, token: str | None = None, body: Any = None
    ) -> tuple[int, Any]:
        from aiostream_ckpt.daemon.client import request

        return request(method, self.url + path, token=token, body=body, timeout=60)

    def wait(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code

    def summary(self) -> dict[str, Any]:
        """The JSON status line the CLI prints last."""
        return dict(orjson.loads(self.stderr.strip().splitlines()[-1]))

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def generated_pv_args(
    ckpt: Path,
    out: Path,
    *extra: str,
    events: int = 60_000,
    splits: int = 2,
    keys: int = 300,
    parallelism: int = 2,
) -> list[str]:
    """``aiostream-ckpt run apps.pv_count`` over generated events, 100 ms checkpoints."""
    return [
        "run", "apps.pv_count",
        "--set", f"checkpoint.dir={ckpt}",
        "--set", f"app.output={out}",
        "--set", f"app.generate={events}",
        "--set", f"app.splits={splits}",
        "--set", f"app.keys={keys}",
        "--set", f"job.parallelism={parallelism}",
        "--set", "checkpoint.interval=100ms",
        *extra,
    ]  # fmt: skip


def completed_checkpoint(
    uid: str, parallelism: int, subtasks: dict[int, dict[str, Any]], *, max_parallelism: int = 128
) -> CompletedCheckpoint:
    """A ``CompletedCheckpoint`` holding ``subtasks`` (index -> state entry) of operator ``uid``."""
    return CompletedCheckpoint(
        checkpoint_id=7,
        is_savepoint=True,
        job_name="j",
        trigger_time=0.0,
        completion_time=0.0,
        duration_seconds=0.0,
        max_parallelism=max_parallelism,
        operators={
            uid: {
                "parallelism": parallelism,
                "subtasks": {str(i): st for i, st in subtasks.items()},
            }
        },
        tasks={},
        size_bytes=0,
        directory=Path("/sp"),
        root=Path("/sp"),
    )


async def topic_end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[str, Any]:
    """Per isolation level, the end offset of each partition (read_committed: the stable one)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    tps = [TopicPartition(topic, p) for p in range(partitions)]
    ends = {}
    for level in ("read_committed", "read_uncommitted"):
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=level)
        await consumer.start()
        try:
            ends[level] = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
    return ends


async def stable_equals_high_watermark(
    bootstrap: str, topic: str, partitions: int, *, limit: float = 10.0
) -> None:
    """No open transaction on ``topic``: a read_committed reader can reach the end.

    Waits up to ``limit`` seconds for it. Why: a commit returns to the producer
    once the coordinator logged it; the broker writes the commit markers into
    the partitions after that, and until a partition has its marker its stable
    offset stays before the transaction (a read right after a job's last
    commit found a partition empty in a CI run). A transaction left open stays
    open far longer (``transaction.timeout.ms``), so it still fails here.
    """
    import asyncio
    import time

    deadline = time.monotonic() + limit
    while True:
        ends = await topic_end_offsets(bootstrap, topic, partitions)
        if ends["read_committed"] == ends["read_uncommitted"] or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert ends["read_committed"] == ends["read_uncommitted"], ends


# -- Kafka wire fakes: what a broker answers to aiostream_ckpt_dev.kafka_wire ------------


def list_offsets_response(cid: int, topic: str, parts: dict[int, int], err: int = 0) -> bytes:
    """A ListOffsets v2 response body, as the broker sends it (after the size prefix)."""
    name = topic.encode()
    body = struct.pack(">iii", cid, 0, 1) + struct.pack(">h", len(name)) + name
    body += struct.pack(">i", len(parts))
    for p, off in parts.items():
        body += struct.pack(">ihqq", p, err, -1, off)
    return body


def parse_list_offsets_request(frame: bytes) -> tuple[int, int, int, str, list[int]]:
    """Read a ListOffsets v2 request (after the size prefix) as a broker would."""
    api, ver, cid, clen = struct.unpack_from(">hhih", frame, 0)
    pos = 10 + clen
    replica, isolation, n_topics, nlen = struct.unpack_from(">ibih", frame, pos)
    pos += 11
    topic = frame[pos : pos + nlen].decode()
    pos += nlen
    (n_parts,) = struct.unpack_from(">i", frame, pos)
    pos += 4
    parts = []
    for _ in range(n_parts):
        p, ts = struct.unpack_from(">iq", frame, pos)
        assert ts == -1  # latest
        parts.append(p)
        pos += 12
    assert (replica, isolation, n_topics, pos) == (-1, 0, 1, len(frame))
    return api, ver, cid, topic, parts
