"""Building one attempt's tasks: the same code in the main process and in each worker.

An attempt's tasks are built from the planned chains, the restore point the
main process chose, and whatever answers for the coordinator where they run:
the :class:`~aiostream_ckpt.checkpoint.coordinator.CheckpointCoordinator`
itself in a single process, its proxy over the control connection in a
worker (``runtime.workers.worker_attempt``). With a ``share`` only that worker's
subtasks are built, their channels to other workers on the peer sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiostream_ckpt.aio import FixedThreadPool
from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.checkpoint.responder import TaskCoordinator
from aiostream_ckpt.clock import Clock
from aiostream_ckpt.connectors.base import ConnectorContext, DeadLetterFn, RestoreInfo
from aiostream_ckpt.connectors.files import DeadLetterWriter
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.runtime.async_io.async_task import AsyncWaitTask, is_async_chain
from aiostream_ckpt.runtime.chain import ChainSpec
from aiostream_ckpt.runtime.graph import Chain, build_chain_specs
from aiostream_ckpt.runtime.network.placement import ProcessShare
from aiostream_ckpt.runtime.task import StreamTask
from aiostream_ckpt.runtime.two_input.co_process import CoProcessTask, is_co_chain
from aiostream_ckpt.state.lmdb.backend import LmdbStateBackendFactory


@dataclass(frozen=True)
class AttemptSetup:
    """What every task of one attempt is built with, wherever it runs."""

    job_name: str
    config: JobConfig
    params: dict[str, Any]
    clock: Clock
    attempt: int
    restored: CompletedCheckpoint | None
    restore: RestoreInfo | None
    #: every checkpoint was set aside: writers recover to "before them all" (id 0)
    fallback: bool
    local_dir: Path


class AttemptThreads:
    """The threads of one attempt, all started with it: RSS does not step later.

    ``snapshot``: state snapshot writes, checkpoint metadata and retention;
    ``io``: the writers' fsyncs and renames (a sink's pre-commit at each
    barrier, its commit when the checkpoint completes), kept apart so that
    they never wait behind a large snapshot write. Four let as many subtasks'
    file work run at once; more queue for the milliseconds each takes.
    """

    IO_THREADS = 4

    def __init__(self) -> None:
        self.snapshot = FixedThreadPool(2, "snapshot")
        self.io = FixedThreadPool(self.IO_THREADS, "io")

    def shutdown(self) -> None:
        self.io.shutdown(wait=True, cancel_futures=True)
        self.snapshot.shutdown(wait=True, cancel_futures=True)


def build_tasks(
    setup: AttemptSetup,
    chains: list[Chain],
    coordinator: TaskCoordinator,
    threads: AttemptThreads,
    share: ProcessShare | None = None,
) -> list[StreamTask]:
    """Instantiate the chains (``share``: this worker's subtasks) and their tasks."""
    config = setup.config
    chain_specs = build_chain_specs(
        chains,
        config=config,
        job_name=setup.job_name,
        attempt=setup.attempt,
        backend_factory=_backend_factory(config, setup.clock),
        local_dir=setup.local_dir,
        dead_letter_factory=_dead_letter_factory(config, setup.restore, threads.io),
        connector_context=_connector_context(setup, threads.io),
        monotonic=setup.clock.monotonic,
        share=share,
    )
    params = dict(setup.params)  # one copy per attempt, as a dict for user code
    tasks = [
        _task_class(chain)(
            chain,
            coordinator=coordinator,
            executor=threads.snapshot,
            clock=setup.clock,
            batch_size=config.batch_size,
            params=params,
            restored=setup.restored,
        )
        for chain in chain_specs
    ]
    if setup.fallback:  # every checkpoint was set aside: all earlier output is newer
        for t in tasks:
            t.recover_checkpoint_id = 0
    return tasks


def _backend_factory(config: JobConfig, clock: Clock) -> LmdbStateBackendFactory:
    return LmdbStateBackendFactory(
        cache_max_entries=config.state.cache_max_entries,
        full_checkpoint_every=config.checkpoint.full_every,
        max_delta_ratio=config.checkpoint.max_delta_ratio,
        allow_pickle=config.state.allow_pickle,
        clock=clock,
    )


def _dead_letter_factory(
    config: JobConfig, restore: RestoreInfo | None, io: Executor
) -> Callable[[str, int], DeadLetterWriter] | None:
    directory = config.dead_letter_dir()
    if directory is None:
        return None

    def factory(uid: str, subtask: int) -> DeadLetterWriter:
        return DeadLetterWriter(directory / uid, subtask, restore=restore, executor=io)

    return factory


def _connector_context(
    setup: AttemptSetup, io: Executor
) -> Callable[[str, int, int, DeadLetterFn | None], ConnectorContext]:
    def make(
        uid: str, subtask: int, parallelism: int, dead_letter: DeadLetterFn | None
    ) -> ConnectorContext:
        ctx = ConnectorContext(
            job_name=setup.job_name,
            operator_uid=uid,
            subtask_index=subtask,
            parallelism=parallelism,
            attempt=setup.attempt,
            clock=setup.clock,
            max_concurrent_checkpoints=setup.config.checkpoint.max_concurrent,
            max_parallelism=setup.config.max_parallelism,
            restore=setup.restore,
            executor=io,
            shard=setup.config.shard,
            kafka_security=setup.config.kafka,
        )
        if dead_letter is not None:
            ctx.dead_letter = dead_letter
        return ctx

    return make


def _task_class(spec: ChainSpec) -> type[StreamTask]:
    """Chains headed by an async or a two-input operator run in their task subclass."""
    if is_async_chain(spec):
        return AsyncWaitTask
    if is_co_chain(spec):
        return CoProcessTask
    return StreamTask
