"""Helpers for the event-time tests: a split-aware scripted source, a spy sink, job runs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.clock import Clock
from aiostream_ckpt.jobspec.config import CheckpointConfig, JobConfig
from aiostream_ckpt.jobspec.functions import RuntimeContext
from aiostream_ckpt.jobspec.graph import WindowSpec
from aiostream_ckpt.runtime.job import JobRun, JobRunner
from aiostream_ckpt.runtime.windowing.session_windows import SessionWindowOperator
from aiostream_ckpt.runtime.windowing.window_operator import WindowOperator
from aiostream_ckpt.state.keygroups import KeyGroupRange
from aiostream_ckpt.state.lmdb import LmdbStateBackend
from aiostream_ckpt.time import WatermarkStrategy

WINDOW_MAXP = 128


def ts_of(event: Any) -> int:
    return int(event["ts"])


def strategy(max_delay: int = 0, idle_ms: int | None = None) -> WatermarkStrategy:
    s = WatermarkStrategy.for_bounded_out_of_orderness(max_delay).with_timestamp_assigner(ts_of)
    return s if idle_ms is None else s.with_idleness(idle_ms)


def config(tmp: Path, **kw: Any) -> JobConfig:
    return JobConfig(checkpoint=CheckpointConfig(directory=tmp / "ckpt", interval=0), **kw)


class SplitSource:
    """A source the test feeds per split; its reader reports splits (per-split watermarks)."""

    bounded = True

    def __init__(self, name: str, splits: list[str]) -> None:
        self.name = name
        self.splits = splits
        self.queue: asyncio.Queue[tuple[str, list[Any]] | None] = asyncio.Queue()

    def feed(self, split: str, records: list[Any]) -> None:
        self.queue.put_nowait((split, records))

    def end(self) -> None:
        self.queue.put_nowait(None)

    def create_reader(self, ctx: Any) -> Any:
        return _SplitReader(self)


class _SplitReader:
    def __init__(self, source: SplitSource) -> None:
        self._s = source
        self._pos = dict.fromkeys(source.splits, 0)
        self._ended = False

    async def start(self, restored: dict[str, Any] | None) -> None:
        for split in self._pos:
            self._pos[split] = int((restored or {}).get(split, 0))

    async def read_split_batches(self, max_records: int) -> list[tuple[str, list[Any]]] | None:
        if self._ended:
            return None
        try:
            item = self._s.queue.get_nowait()
        except asyncio.QueueEmpty:
            # Not wait_for(get()): on 3.11 it can swallow the task's cancellation.
            await asyncio.sleep(0.002)
            return []
        if item is None:
            self._ended = True
            return None
        self._pos[item[0]] += len(item[1])
        return [item]

    async def read_batch(self, max_records: int) -> list[Any] | None:
        groups = await self.read_split_batches(max_records)
        return None if groups is None else [r for _, recs in groups for r in recs]

    def active_splits(self) -> list[str]:
        return [] if self._ended else list(self._pos)

    def snapshot_position(self) -> dict[str, Any]:
        return dict(self._pos)

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        return None

    async def close(self) -> None:
        return None


class SpySink:
    """Sees records as soon as they are written (not exactly-once): when did a window fire?"""

    def __init__(self, name: str = "spy") -> None:
        self.name = name
        self.records: list[Any] = []

    def create_writer(self, ctx: Any) -> Any:
        return _SpyWriter(self)


class _SpyWriter:
    def __init__(self, sink: SpySink) -> None:
        self._sink = sink

    async def recover(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> None:
        return None

    async def write(self, batch: list[Any]) -> None:
        self._sink.records.extend(batch)

    async def prepare_commit(self, checkpoint_id: int) -> dict[str, Any]:
        return {}

    async def commit(self, checkpoint_id: int) -> None:
        return None

    async def close(self) -> None:
        return None


async def start(
    env: StreamEnvironment, clock: Clock | None = None
) -> tuple[asyncio.Task[Any], JobRun, JobRunner]:
    """Start ``env``'s job in the background; return (job task, live run, runner)."""
    started: asyncio.Future[JobRun] = asyncio.get_running_loop().create_future()
    runner = JobRunner(env.spec(), clock=clock, on_started=started.set_result)
    job = asyncio.create_task(runner.run())
    done, _ = await asyncio.wait({job, started}, return_when=asyncio.FIRST_COMPLETED)
    if job in done:
        job.result()
        raise AssertionError("the job ended before it started")
    return job, started.result(), runner


async def drained(run: JobRun) -> None:
    """Return once every task has handled all that was sent into the job before the call.

    A checkpoint barrier travels behind the records and watermarks already on
    their way; when it completes, every task has processed what was ahead of
    it. A "nothing fired" check after this is exact, where a sleep would only
    make a wrong firing likely to be seen.
    """
    assert run.coordinator is not None
    await asyncio.wait_for(run.coordinator.trigger(), 30)


def window_backend(
    tmp: Path, uid: str, cache_max_entries: int = 1_000_000, key_type: Any = None
) -> LmdbStateBackend:
    """An LMDB backend of one instance holding every key group (window operator tests)."""
    return LmdbStateBackend(
        operator_uid=uid,
        subtask_index=0,
        key_group_range=KeyGroupRange(0, WINDOW_MAXP - 1),
        max_parallelism=WINDOW_MAXP,
        local_dir=tmp,
        cache_max_entries=cache_max_entries,
        key_type=key_type,
    )


def open_window_operator(spec: WindowSpec, key_selector: Any, backend: LmdbStateBackend) -> Any:
    """The operator the runtime builds for ``spec`` (sessions for a merging assigner), opened."""
    uid = backend.operator_uid
    cls = SessionWindowOperator if spec.assigner.merging else WindowOperator
    op = cls(uid, spec, key_selector)
    op.backend = backend
    op.open(
        RuntimeContext(operator_uid=uid, subtask_index=0, parallelism=1, params={}, backend=backend)
    )
    return op
