"""Job configuration: every knob, with Flink's names where Flink has one.

The values are validated here, once, so a bad value fails at startup with a
message naming the key rather than deep inside a running job.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

# re-exported: the checkpoint's knobs are part of the job's configuration
from aiostream_ckpt.checkpoint.config import CheckpointConfig as CheckpointConfig
from aiostream_ckpt.checkpoint.config import CheckpointingMode as CheckpointingMode
from aiostream_ckpt.connectors.kafka.security import KafkaSecurity
from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.errors import check_config as _check
from aiostream_ckpt.keygroups import WHOLE_JOB, Shard
from aiostream_ckpt.objectstore import ObjectLocation, S3Settings


class RestartStrategyKind(Enum):
    NONE = "none"
    FIXED_DELAY = "fixed_delay"
    EXPONENTIAL_DELAY = "exponential_delay"
    FAILURE_RATE = "failure_rate"


class MalformedPolicy(Enum):
    DEAD_LETTER = "dead_letter"
    FAIL = "fail"


class ProcessErrorPolicy(Enum):
    """What a record whose user function raised does: fail the job, or go to the dead letters."""

    FAIL = "fail"
    DEAD_LETTER = "dead_letter"


@dataclass(frozen=True)
class StateConfig:
    local_dir: Path | None = None
    cache_max_entries: int = 2_000_000
    allow_pickle: bool = False

    def validate(self) -> None:
        _check(
            self.cache_max_entries >= 1, "state.cache_max_entries", self.cache_max_entries, ">= 1"
        )


@dataclass(frozen=True)
class RestartConfig:
    """Restart strategy (Flink's fixed-delay, exponential-delay, failure-rate)."""

    strategy: RestartStrategyKind = RestartStrategyKind.FIXED_DELAY
    attempts: int = 3
    delay: float = 1.0
    max_delay: float = 60.0
    backoff_multiplier: float = 2.0
    reset_after: float = 300.0
    failure_rate_interval: float = 60.0

    def validate(self) -> None:
        _check(self.attempts >= 0, "restart.attempts", self.attempts, ">= 0")
        _check(self.delay >= 0, "restart.delay", self.delay, ">= 0")
        _check(self.max_delay >= self.delay, "restart.max_delay", self.max_delay, ">= delay")
        _check(
            self.backoff_multiplier >= 1.0,
            "restart.backoff_multiplier",
            self.backoff_multiplier,
            ">= 1",
        )
        _check(
            self.failure_rate_interval > 0,
            "restart.failure_rate_interval",
            self.failure_rate_interval,
            "> 0",
        )


@dataclass(frozen=True)
class ErrorConfig:
    """What happens to records that cannot be read, or whose processing raised."""

    on_malformed: MalformedPolicy = MalformedPolicy.DEAD_LETTER
    dead_letter_dir: Path | None = None
    on_process_error: ProcessErrorPolicy = ProcessErrorPolicy.FAIL
    #: More dead-lettered process errors than this in one task between two
    #: checkpoints fail the job: a bug in the function, not a bad record.
    max_process_errors_per_checkpoint: int = 100

    def __post_init__(self) -> None:
        _check(
            self.max_process_errors_per_checkpoint >= 1,
            "errors.max_process_errors_per_checkpoint",
            self.max_process_errors_per_checkpoint,
            ">= 1",
        )

    @property
    def dead_letters_needed(self) -> bool:
        """Whether any policy sends records to the dead-letter output."""
        return (
            self.on_malformed is MalformedPolicy.DEAD_LETTER
            or self.on_process_error is ProcessErrorPolicy.DEAD_LETTER
        )


def usable_cores() -> int:
    """Return how many cores this process may run on (its CPU affinity, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class JobConfig:
    parallelism: int = 1
    #: processes running the subtasks (``runtime.network.placement``); 1: all in this process
    workers: int = 1
    #: seconds a worker process may take to say hello (start, import, build the job)
    worker_start_timeout: float = 120.0
    #: seconds a worker may take to restore its share, and to recover its outputs (each);
    #: None: ``worker_start_timeout``
    worker_restore_timeout: float | None = None
    #: seconds between a running worker's heartbeats (``runtime.workers.heartbeats``)
    heartbeat_interval: float = 1.0
    #: seconds a running worker may be silent before it is killed and the attempt fails
    heartbeat_timeout: float = 20.0
    max_parallelism: int = 128
    #: the part of the job this daemon runs (``--shard I/N``; see ``keygroups.Shard``)
    shard: Shard = WHOLE_JOB
    batch_size: int = 2048
    channel_capacity: int = 8
    chaining: bool = True
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    state: StateConfig = field(default_factory=StateConfig)
    restart: RestartConfig = field(default_factory=RestartConfig)
    errors: ErrorConfig = field(default_factory=ErrorConfig)
    #: how every Kafka client of the job connects (``kafka.*``: TLS, SASL)
    kafka: KafkaSecurity = field(default_factory=KafkaSecurity)
    #: how to reach an object store (``checkpoint.dir=s3://...``, s3:// file sinks)
    s3: S3Settings = field(default_factory=S3Settings)
    restore_from: Path | None = None
    allow_non_restored_state: bool = False
    #: let a savepoint restore move output committed after it aside (see the output contract)
    allow_retract_output: bool = False
    #: let a restore replay output that cannot be retracted (committed Kafka transactions)
    allow_duplicate_output: bool = False

    def validate(self) -> JobConfig:
        _check(
            1 <= self.max_parallelism <= 32768,
            "job.max_parallelism",
            self.max_parallelism,
            "1..32768",
        )
        _check(
            1 <= self.parallelism <= self.max_parallelism,
            "job.parallelism",
            self.parallelism,
            f"1..max_parallelism ({self.max_parallelism})",
        )
        _check(
            self.shard.count <= self.max_parallelism,
            "job.shard",
            str(self.shard),
            f"at most job.max_parallelism ({self.max_parallelism}) shards: each shard owns "
            "whole key groups, and there are that many",
        )
        cores = usable_cores()
        _check(
            1 <= self.workers <= cores,
            "job.workers",
            self.workers,
            f"1..{cores} (the cores this process may run on)",
        )
        _check(
            self.worker_start_timeout > 0,
            "job.worker_start_timeout",
            self.worker_start_timeout,
            "> 0",
        )
        _check(
            self.worker_restore_timeout is None or self.worker_restore_timeout > 0,
            "job.worker_restore_timeout",
            self.worker_restore_timeout,
            "> 0",
        )
        _check(
            self.heartbeat_interval > 0, "job.heartbeat_interval", self.heartbeat_interval, "> 0"
        )
        _check(
            self.heartbeat_timeout > self.heartbeat_interval,
            "job.heartbeat_timeout",
            self.heartbeat_timeout,
            f"longer than job.heartbeat_interval ({self.heartbeat_interval:g}s): else a "
            "healthy worker is timed out between two of its heartbeats",
        )
        _check(self.batch_size >= 1, "job.batch_size", self.batch_size, ">= 1")
        _check(self.channel_capacity >= 1, "job.channel_capacity", self.channel_capacity, ">= 1")
        self.checkpoint.validate()
        self.state.validate()
        self.restart.validate()
        self.kafka.validate()
        self.s3.validate()
        return self

    def checkpoint_dir(self) -> Path | None:
        """Return this daemon's checkpoint directory: ``checkpoint.dir``, or its shard's in it.

        Each shard has its own chain (``<checkpoint.dir>/shard-I-of-N``), so
        shards share no checkpoint and one lock per shard refuses a second
        daemon given the same shard.
        """
        directory = self.checkpoint.directory
        return None if directory is None else self.shard_path(directory)

    def checkpoint_location(self) -> ObjectLocation | None:
        """Return this daemon's object-store chain: ``checkpoint.dir=s3://...``, or its shard's.

        A shard's is ``<prefix>/shard-I-of-N``, as its local directory: each
        shard claims and fences its own chain.
        """
        remote = self.checkpoint.remote
        if remote is None or not self.shard.sharded:
            return remote
        return remote.child(self.shard.dirname)

    def shard_path(self, directory: Path) -> Path:
        """``directory`` itself, or its shard's subdirectory when the job runs sharded."""
        return directory / self.shard.dirname if self.shard.sharded else directory

    def local_state_root(self) -> Path:
        """Where attempts keep their working state: ``state.local_dir``.

        It defaults to ``<checkpoint.dir>/local-state``, on the checkpoint
        volume: the one place a container is sure to be able to write (never
        the temp dir, which a read-only root does not have).
        """
        if self.state.local_dir is not None:
            return self.shard_path(self.state.local_dir)
        directory = self.checkpoint_dir()
        if directory is None:
            raise ConfigError("checkpoint.dir is not set: the job needs a checkpoint directory")
        return directory / "local-state"

    def dead_letter_dir(self) -> Path | None:
        """Where dead letters go: ``errors.dead_letter_dir`` or the checkpoint's; None if none."""
        if not self.errors.dead_letters_needed:
            return None
        if self.errors.dead_letter_dir is not None:
            return self.shard_path(self.errors.dead_letter_dir)
        directory = self.checkpoint_dir()
        return None if directory is None else directory / "dead-letter"

    def with_checkpoint_dir(self, directory: Path) -> JobConfig:
        return dataclasses.replace(
            self, checkpoint=dataclasses.replace(self.checkpoint, directory=directory)
        )
