"""Checkpointing knobs (``checkpoint.*``), validated once at startup.

Part of the job configuration (``jobspec.config.JobConfig.checkpoint``), kept
here so the coordinator reads its own knobs without importing the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.errors import check_config as _check
from aiostream_ckpt.objectstore import ObjectLocation


class CheckpointingMode(Enum):
    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpointing knobs (seconds for durations; ``interval`` 0 disables periodic ones).

    With ``checkpoint.dir=s3://...``, ``remote`` is that location and
    ``directory`` its local copy (``checkpoint.local_dir``): the working
    state, snapshots before their upload, downloaded chains.
    """

    directory: Path | None = None
    remote: ObjectLocation | None = None
    #: the local copy's directory as configured (``checkpoint.local_dir``); None: the default
    local_dir: Path | None = None
    interval: float = 1.0
    timeout: float = 60.0
    max_concurrent: int = 1
    min_pause: float = 0.0
    tolerable_failures: int = 3
    retained: int = 2
    mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE
    full_every: int = 10
    max_delta_ratio: float = 0.5
    alignment_max_buffered_batches: int = 4096
    #: Flink's unaligned checkpoints: barriers overtake queued records, which go
    #: into the checkpoint as channel state (``barrier.unaligned``)
    unaligned: bool = False
    #: with ``unaligned``: seconds a checkpoint stays aligned at a task before it turns
    #: unaligned there (Flink's ``alignedCheckpointTimeout``); 0: unaligned from the start
    aligned_timeout: float = 0.0

    def validate(self) -> None:
        if self.remote is not None and self.directory is None:
            raise ConfigError(f"checkpoint.dir={self.remote} needs checkpoint.local_dir")
        _check(self.interval >= 0, "checkpoint.interval", self.interval, ">= 0")
        _check(self.timeout > 0, "checkpoint.timeout", self.timeout, "> 0")
        _check(self.max_concurrent >= 1, "checkpoint.max_concurrent", self.max_concurrent, ">= 1")
        _check(self.min_pause >= 0, "checkpoint.min_pause", self.min_pause, ">= 0")
        _check(
            self.tolerable_failures >= 0,
            "checkpoint.tolerable_failures",
            self.tolerable_failures,
            ">= 0",
        )
        _check(self.retained >= 1, "checkpoint.retained", self.retained, ">= 1")
        _check(self.full_every >= 1, "checkpoint.full_every", self.full_every, ">= 1")
        _check(
            self.max_delta_ratio >= 0, "checkpoint.max_delta_ratio", self.max_delta_ratio, ">= 0"
        )
        _check(
            self.alignment_max_buffered_batches >= 1,
            "checkpoint.alignment_max_buffered_batches",
            self.alignment_max_buffered_batches,
            ">= 1",
        )
        _check(
            self.aligned_timeout >= 0, "checkpoint.aligned_timeout", self.aligned_timeout, ">= 0"
        )
        _check(
            self.unaligned or self.aligned_timeout == 0,
            "checkpoint.aligned_timeout",
            self.aligned_timeout,
            "0 unless checkpoint.unaligned=true (the timeout is when an aligned checkpoint "
            "turns unaligned)",
        )
        if self.unaligned:
            _check(
                self.mode is CheckpointingMode.EXACTLY_ONCE,
                "checkpoint.mode",
                self.mode.value,
                "exactly_once with checkpoint.unaligned=true (at-least-once holds nothing back, "
                "so there is nothing for a barrier to overtake)",
            )
            _check(
                self.max_concurrent == 1,
                "checkpoint.max_concurrent",
                self.max_concurrent,
                "1 with checkpoint.unaligned=true (as in Flink: a task takes one unaligned "
                "checkpoint at a time)",
            )
