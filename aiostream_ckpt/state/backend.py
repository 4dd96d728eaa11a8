"""The keyed state backend seam.

The runtime talks to keyed state only through :class:`KeyedStateBackend`.
Snapshot contract (asynchronous barrier snapshotting):

1. ``snapshot(target)`` runs on the event loop when the barrier reaches the
   operator. It must be short and must not grow with the number of pending
   writes: it only freezes them (the LMDB backend swaps in a fresh write set).
   It returns the *asynchronous part*, a plain function.
2. The runtime runs that function in a worker thread while processing goes on.
   It makes the frozen writes durable, writes the snapshot files below
   ``target`` and returns a :data:`StateHandle`. Writes made after step 1 must
   not appear in it, whenever and in whatever order the async parts run.
3. The handle is stored in the checkpoint metadata. ``notify_checkpoint_complete``
   tells the backend which snapshot is now a valid base for incremental ones.

``restore`` receives the handles of one or more old instances (more than one
when the parallelism changed) and keeps only key groups in its own range.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from aiostream_ckpt.state.descriptors import StateDescriptor
from aiostream_ckpt.state.keygroups import KeyGroupRange

#: JSON-able description of a snapshot. Must contain ``"files"``: every file
#: (relative to the checkpoint root) the snapshot needs to be restored, including
#: files of earlier checkpoints it builds on, so retention knows what to keep.
StateHandle = dict[str, Any]


class KeyContext:
    """The key the current record belongs to; the operator sets it, states read it."""

    __slots__ = ("key",)

    def __init__(self) -> None:
        self.key: Any = None


@dataclass(frozen=True, slots=True)
class SnapshotTarget:
    """Where one operator instance writes one snapshot.

    ``exclusive_dir`` belongs to this checkpoint alone (deleted with it);
    ``shared_dir`` holds files later checkpoints may reuse (incremental bases).
    A savepoint must be self-contained: everything in ``exclusive_dir``.
    """

    checkpoint_id: int
    root: Path
    exclusive_dir: Path
    shared_dir: Path
    is_savepoint: bool = False

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()


class ValueState(Protocol):
    def value(self) -> Any: ...
    def update(self, value: Any) -> None: ...
    def clear(self) -> None: ...


class ListState(Protocol):
    def get(self) -> list[Any]: ...
    def add(self, value: Any) -> None: ...
    def add_all(self, values: Sequence[Any]) -> None: ...
    def update(self, values: Sequence[Any]) -> None: ...
    def clear(self) -> None: ...


class MapState(Protocol):
    def get(self, map_key: Any, default: Any = None) -> Any: ...
    def put(self, map_key: Any, value: Any) -> None: ...
    def contains(self, map_key: Any) -> bool: ...
    def remove(self, map_key: Any) -> None: ...
    def items(self) -> Iterator[tuple[Any, Any]]: ...
    def keys(self) -> Iterator[Any]: ...
    def values(self) -> Iterator[Any]: ...
    def is_empty(self) -> bool: ...
    def clear(self) -> None: ...


class ReducingState(Protocol):
    def get(self) -> Any: ...
    def add(self, value: Any) -> None: ...
    def clear(self) -> None: ...


AsyncSnapshotPart = Callable[[], StateHandle]


class KeyedStateBackend(Protocol):
    """Keyed state of one operator instance."""

    key_context: KeyContext
    key_group_range: KeyGroupRange

    def create_state(self, descriptor: StateDescriptor) -> Any:
        """Return the state object for ``descriptor`` (same object on repeated calls)."""
        ...

    def restore(self, root: Path, handles: Sequence[StateHandle]) -> None:
        """Load state from snapshots of one or more old instances (before any state is used)."""
        ...

    def snapshot(self, target: SnapshotTarget) -> AsyncSnapshotPart:
        """Run the synchronous part of a snapshot; return the part to run in a thread."""
        ...

    def trim_caches(self) -> None:
        """Keep the state caches within their bound (the task calls it after every batch)."""
        ...

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None: ...

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None: ...

    def keys(self, state_name: str) -> Iterator[Any]:
        """Every key that has a value in ``state_name`` (for timers, windows, tests)."""
        ...

    def close(self) -> None:
        """Release the local working copy; the checkpoints stay."""
        ...


class KeyedStateBackendFactory(Protocol):
    def __call__(
        self,
        *,
        operator_uid: str,
        subtask_index: int,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        local_dir: Path,
    ) -> KeyedStateBackend: ...
