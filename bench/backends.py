"""The state backend the operator benches drive: one instance that owns every key group."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiostream_ckpt.state.keygroups import KeyGroupRange
from aiostream_ckpt.state.lmdb import LmdbStateBackend

MAX_PARALLELISM = 128


def one_instance_backend(uid: str, local_dir: Path, **options: Any) -> LmdbStateBackend:
    """Return subtask 0's LMDB backend over all key groups; ``options`` are the backend's own."""
    return LmdbStateBackend(
        operator_uid=uid,
        subtask_index=0,
        key_group_range=KeyGroupRange(0, MAX_PARALLELISM - 1),
        max_parallelism=MAX_PARALLELISM,
        local_dir=local_dir,
        **options,
    )
