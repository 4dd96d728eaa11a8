"""The keyed state backend seam.

The runtime talks to keyed state only through :class:`KeyedStateBackend`.
Snapshot contract (asynchronous barrier snapshotting):

1. ``snapshot(target)`` runs on the event loop when the barrier reaches the
   operator. It must be short and must not grow with the number of pending
   writes: it only freezes them (the LMDB backend swaps in a fresh write set).
   It returns the *asynchronous part*, an :class:`AsyncSnapshotPart`.
2. While processing goes on, the runtime awaits its ``prepare()`` on the event
   loop, then runs its ``write()`` in a worker thread and acknowledges the
   :data:`StateHandle` it returns, then awaits its ``settle()`` on the loop.
   ``prepare`` does the work the snapshot needs that needs the interpreter
   (the LMDB backend encodes the frozen write sets into records, in slices,
   yielding to the loop between them); ``write`` does the long work that does
   not (copying a pinned view, writing and fsyncing files below ``target``);
   ``settle`` does deferred work the snapshot does not wait for (the LMDB
   backend writes the records into its working copy). Writes made after step
   1 must not appear in the handle, whenever and in whatever order the async
   parts run, and whether or not they run at all.
3. The handle is stored in the checkpoint metadata. ``notify_checkpoint_complete``
   tells the backend which snapshot is now a valid base for incremental ones.

``restore`` receives the handles of one or more old instances (more than one
when the parallelism changed) and keeps only key groups in its own range.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
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


class SharedFilePins(Protocol):
    """What keeps shared files from retention while a backend may still need them.

    A backend pins every file a snapshot's chain names (the files it builds
    on at once, each new file before writing it) under ``(owner, checkpoint
    id)``; on checkpoint-complete n it drops its pins below n (n's chain is
    its base now, still pinned), on abort n the pins of n.
    """

    def pin(self, owner: str, checkpoint_id: int, files: Iterable[str]) -> None: ...

    def unpin(self, owner: str, *, below: int | None = None, only: int | None = None) -> None: ...


@dataclass(frozen=True, slots=True)
class SnapshotTarget:
    """Where one operator instance writes one snapshot.

    ``exclusive_dir`` belongs to this checkpoint alone (deleted with it);
    ``shared_dir`` holds files later checkpoints may reuse (incremental bases),
    kept by retention while ``pins`` holds them.
    A savepoint must be self-contained: everything in ``exclusive_dir``.
    """

    checkpoint_id: int
    root: Path
    exclusive_dir: Path
    shared_dir: Path
    is_savepoint: bool = False
    pins: SharedFilePins | None = None

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


class AsyncSnapshotPart(Protocol):
    """The asynchronous part of one snapshot: ``prepare``, ``write`` (in a thread), ``settle``.

    Why: CPython runs one thread's Python at a time, and a worker thread that
    hands the GIL back and forth many times (py-lmdb releases it around every
    put) waits for it each time behind the busy event loop. So the per-key
    work runs on the loop, cooperatively, and the thread gets only work that
    keeps the GIL released for long stretches. ``settle`` comes after the
    acknowledgement, so the checkpoint does not wait for work it does not need.
    """

    async def prepare(self) -> None:
        """Run on the event loop, yielding to it often; raises if the snapshot was cancelled.

        Cancelling the awaiting task loses nothing: the work left is done by
        whoever needs it next (a later snapshot, a cache eviction).
        """
        ...

    def write(self) -> StateHandle:
        """Run in a worker thread once ``prepare()`` returned: write the files; give the handle."""
        ...

    async def settle(self) -> None:
        """Run on the event loop after the handle was acknowledged, yielding to it often.

        Optional for the snapshot: cancelling it, or never running it, loses
        nothing (the backend does the work when it needs it).
        """
        ...


class KeyedStateBackend(Protocol):
    """Keyed state of one operator instance."""

    key_context: KeyContext
    key_group_range: KeyGroupRange
    #: Entries the state caches may hold in all (``state.cache_max_entries``): an operator
    #: that holds state of its own in memory between barriers bounds it by this too.
    cache_max_entries: int

    def create_state(self, descriptor: StateDescriptor) -> Any:
        """Return the state object for ``descriptor`` (same object on repeated calls)."""
        ...

    def check_key(self, key: Any, where: str) -> None:
        """Raise ``StateTypeError`` for a stream key that would read back as another type.

        The check a state makes at a key's first access (``StateError`` if the
        key cannot be stored at all); ``where`` names the operator in the error.
        For an operator that holds keys in memory between barriers (tumbling
        windows): without it such a key failed at the next checkpoint's flush,
        far from its record, or never if its window fired before a barrier.
        Exact ``str``/``int`` keys of an untyped backend cost two identity tests.
        """
        ...

    def restore(self, root: Path, handles: Sequence[StateHandle]) -> None:
        """Load state from snapshots of one or more old instances (before any state is used)."""
        ...

    def snapshot(self, target: SnapshotTarget) -> AsyncSnapshotPart:
        """Run the synchronous part of a snapshot; return the asynchronous part."""
        ...

    def after_batch(self) -> None:
        """Keep the state caches within their bound; adapt to the batch just processed.

        The keyed operator's business: it calls this after every batch and timer
        firing (``StreamOperator.end_batch``); the runtime never does.
        """
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
        key_type: Any = None,
    ) -> KeyedStateBackend: ...
