"""Keyed state as a function sees it: generic protocols, typed by their descriptors.

``ctx.get_state(ValueStateDescriptor("n", int, default=0))`` is a
``ValueState[int]`` for mypy, so a wrong ``update`` is found before the job
runs. The backend's classes (``state/lmdb``) implement these; the checks at
the end of this module make mypy prove it. All reads and writes act on the
current key, which the operator sets before each record and timer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


class ValueState(Protocol[T]):
    """One value per key (Flink's ``ValueState``)."""

    def value(self) -> T:
        """Return the key's value; the descriptor's default (else ``None``) if never written."""
        ...

    def update(self, value: T) -> None:
        """Set the key's value (``None`` clears it)."""
        ...

    def clear(self) -> None: ...


class ListState(Protocol[T]):
    """A list per key (Flink's ``ListState``); a key never written has ``[]``."""

    def get(self) -> list[T]:
        """Return a copy of the key's list: changing it changes no state."""
        ...

    def add(self, value: T) -> None: ...

    def add_all(self, values: Sequence[T]) -> None: ...

    def update(self, values: Sequence[T]) -> None:
        """Replace the key's list."""
        ...

    def clear(self) -> None: ...


class MapState(Protocol[K, V]):
    """A map per key (Flink's ``MapState``)."""

    @overload
    def get(self, map_key: K) -> V | None: ...
    @overload
    def get(self, map_key: K, default: V) -> V: ...

    def put(self, map_key: K, value: V) -> None: ...

    def contains(self, map_key: K) -> bool: ...

    def remove(self, map_key: K) -> None: ...

    def items(self) -> Iterator[tuple[K, V]]: ...

    def keys(self) -> Iterator[K]: ...

    def values(self) -> Iterator[V]: ...

    def is_empty(self) -> bool: ...

    def clear(self) -> None: ...


class ReducingState(Protocol[T]):
    """One value per key, folded with the descriptor's ``reduce_fn`` (Flink's ``ReducingState``)."""

    def get(self) -> T | None:
        """Return the folded value; ``None`` before the key's first ``add``."""
        ...

    def add(self, value: T) -> None: ...

    def clear(self) -> None: ...


if TYPE_CHECKING:  # the lmdb backend's states implement the protocols: mypy checks it here
    from aiostream_ckpt.state.lmdb import map_state as m
    from aiostream_ckpt.state.lmdb import states as s

    _value: tuple[type[ValueState[Any]], ...] = (
        s.ValueStateImpl,
        s.TtlValueState,
        s.TypedValueState,
    )
    _list: tuple[type[ListState[Any]], ...] = (s.ListStateImpl, s.TtlListState)
    _map: tuple[type[MapState[Any, Any]], ...] = (m.MapStateImpl, m.TtlMapState)
    _reducing: tuple[type[ReducingState[Any]], ...] = (
        s.ReducingStateImpl,
        s.TtlReducingState,
        s.TypedReducingState,
    )
