"""The keyed states a :class:`KeyedAsyncFunction` gets: reads of its key, writes into its call.

Why buffered (see :mod:`aiostream_ckpt.runtime.async_io.async_keyed`): a call still in
flight at a barrier is re-issued after a restore, so none of its writes may be
in the snapshot. Each state therefore keeps one *buffer* per call (in the
call's entry, under the state's name): what the call wrote, on top of what its
key had when the call started. Reads combine the two, so a call sees its own
writes; the operator applies the buffer to keyed state when the call's result
is emitted, and drops a failed attempt's. A value read from keyed state is a
copy: changing it in place must not reach the state before emission.

One buffer type per kind, each applied with the kind's own operations:

- value: the new value, or cleared;
- list: a replacement list (``update``/``clear``) and the elements added after it;
- map: cleared or not, and the entries put or removed after that;
- reducing: cleared or not, and the values added after that (folded on read,
  added one by one on apply, so ``reduce_fn`` need not be associative).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from aiostream_ckpt.errors import StateError
from aiostream_ckpt.runtime.async_io.async_wait import _Entry
from aiostream_ckpt.state.codecs import EXACT_SCALARS
from aiostream_ckpt.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)

B = TypeVar("B")

_CLEARED = object()
_REMOVED = object()


class KeyedCalls(Protocol):
    """What a buffered state needs of its operator."""

    def current_call(self, name: str) -> _Entry:
        """Return the entry of the call running now (else raise a StateError naming ``name``)."""
        ...

    def keyed_state(self, descriptor: StateDescriptor) -> Any:
        """Return the backend's state for ``descriptor``."""
        ...

    def set_key(self, key: Any) -> None: ...


def detached(value: Any) -> Any:
    """``value``, or a deep copy of it unless it is an immutable scalar."""
    return value if value.__class__ in EXACT_SCALARS else copy.deepcopy(value)


class BufferedState(ABC, Generic[B]):
    """Base: find the call, its buffer for this state, and its key's stored state."""

    def __init__(self, op: KeyedCalls, descriptor: StateDescriptor) -> None:
        self._op = op
        self._name = descriptor.name
        self._state = op.keyed_state(descriptor)

    @abstractmethod
    def _new_buffer(self) -> B:
        """Return an empty buffer of this kind of state, for a call's first write."""

    def _buffer(self) -> tuple[_Entry, B | None]:
        """Return the running call and its buffer of this state (None: nothing written yet)."""
        entry = self._op.current_call(self._name)
        writes = entry.writes
        return entry, None if writes is None else writes.get(self._name)

    def _writable(self) -> B:
        entry = self._op.current_call(self._name)
        writes = entry.writes
        if writes is None:
            writes = entry.writes = {}
        buf = writes.get(self._name)
        if buf is None:
            buf = writes[self._name] = self._new_buffer()
        return buf

    def _stored(self, entry: _Entry) -> Any:
        """Return the backend's state set to the call's key (other calls move the key)."""
        self._op.set_key(entry.key)
        return self._state

    @abstractmethod
    def apply(self, buf: B) -> None:
        """Write an emitted call's buffer into keyed state; the operator set the key."""


class _ValueBuffer:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: Any = _CLEARED


class BufferedValueState(BufferedState[_ValueBuffer]):
    def __init__(self, op: KeyedCalls, descriptor: ValueStateDescriptor[Any]) -> None:
        super().__init__(op, descriptor)
        self._default = descriptor.default

    def _new_buffer(self) -> _ValueBuffer:
        return _ValueBuffer()

    def value(self) -> Any:
        entry, buf = self._buffer()
        if buf is not None:
            return copy.deepcopy(self._default) if buf.value is _CLEARED else buf.value
        return detached(self._stored(entry).value())

    def update(self, value: Any) -> None:
        self._writable().value = _CLEARED if value is None else value

    def clear(self) -> None:
        self._writable().value = _CLEARED

    def apply(self, buf: _ValueBuffer) -> None:
        if buf.value is _CLEARED:
            self._state.clear()
        else:
            self._state.update(buf.value)


class _ListBuffer:
    __slots__ = ("added", "base")

    def __init__(self) -> None:
        self.base: list[Any] | None = None  # None: the key's stored list, else its replacement
        self.added: list[Any] = []


class BufferedListState(BufferedState[_ListBuffer]):
    def _new_buffer(self) -> _ListBuffer:
        return _ListBuffer()

    def get(self) -> list[Any]:
        entry, buf = self._buffer()
        if buf is None:
            return detached(self._stored(entry).get())  # type: ignore[no-any-return]
        base = detached(self._stored(entry).get()) if buf.base is None else list(buf.base)
        return [*base, *buf.added]

    def add(self, value: Any) -> None:
        self._writable().added.append(value)

    def add_all(self, values: Sequence[Any]) -> None:
        self._writable().added.extend(values)

    def update(self, values: Sequence[Any]) -> None:
        buf = self._writable()
        buf.base, buf.added = list(values), []

    def clear(self) -> None:
        self.update(())

    def apply(self, buf: _ListBuffer) -> None:
        if buf.base is not None:
            self._state.update([*buf.base, *buf.added])
        elif buf.added:
            self._state.add_all(buf.added)


class _MapBuffer:
    __slots__ = ("cleared", "puts")

    def __init__(self) -> None:
        self.cleared = False
        self.puts: dict[Any, Any] = {}  # map key -> value, or _REMOVED


class BufferedMapState(BufferedState[_MapBuffer]):
    def _new_buffer(self) -> _MapBuffer:
        return _MapBuffer()

    def get(self, map_key: Any, default: Any = None) -> Any:
        entry, buf = self._buffer()
        if buf is not None:
            v = buf.puts.get(map_key, _CLEARED)
            if v is not _CLEARED:
                return default if v is _REMOVED else v
            if buf.cleared:
                return default
        v = self._stored(entry).get(map_key, _REMOVED)
        return default if v is _REMOVED else detached(v)

    def put(self, map_key: Any, value: Any) -> None:
        self._writable().puts[map_key] = value

    def remove(self, map_key: Any) -> None:
        self._writable().puts[map_key] = _REMOVED

    def contains(self, map_key: Any) -> bool:
        return self.get(map_key, _REMOVED) is not _REMOVED

    def _items(self) -> list[tuple[Any, Any]]:
        # read whole now: an iterator of the stored map would follow whatever key
        # another call sets while this one awaits
        entry, buf = self._buffer()
        if buf is None:
            return [(k, detached(v)) for k, v in self._stored(entry).items()]
        puts = buf.puts
        out = (
            []
            if buf.cleared
            else [(k, detached(v)) for k, v in self._stored(entry).items() if k not in puts]
        )
        out.extend((k, v) for k, v in puts.items() if v is not _REMOVED)
        return out

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(self._items())

    def keys(self) -> Iterator[Any]:
        return iter([k for k, _ in self._items()])

    def values(self) -> Iterator[Any]:
        return iter([v for _, v in self._items()])

    def is_empty(self) -> bool:
        return not self._items()

    def clear(self) -> None:
        buf = self._writable()
        buf.cleared, buf.puts = True, {}

    def apply(self, buf: _MapBuffer) -> None:
        state = self._state
        if buf.cleared:
            state.clear()
        for k, v in buf.puts.items():
            if v is _REMOVED:
                state.remove(k)
            else:
                state.put(k, v)


class _ReducingBuffer:
    __slots__ = ("added", "cleared")

    def __init__(self) -> None:
        self.cleared = False
        self.added: list[Any] = []


class BufferedReducingState(BufferedState[_ReducingBuffer]):
    def __init__(self, op: KeyedCalls, descriptor: ReducingStateDescriptor[Any]) -> None:
        super().__init__(op, descriptor)
        self._reduce: Callable[[Any, Any], Any] = descriptor.reduce_fn

    def _new_buffer(self) -> _ReducingBuffer:
        return _ReducingBuffer()

    def get(self) -> Any:
        entry, buf = self._buffer()
        acc = None if buf is not None and buf.cleared else detached(self._stored(entry).get())
        for v in () if buf is None else buf.added:
            # copies: a reduce_fn that changes its accumulator in place must not
            # change a buffered value (it is added to the state on emission)
            acc = detached(v) if acc is None else self._reduce(acc, detached(v))
        return acc

    def add(self, value: Any) -> None:
        self._writable().added.append(value)

    def clear(self) -> None:
        buf = self._writable()
        buf.cleared, buf.added = True, []

    def apply(self, buf: _ReducingBuffer) -> None:
        state = self._state
        if buf.cleared:
            state.clear()
        for v in buf.added:
            state.add(v)


def buffered_state(op: KeyedCalls, descriptor: StateDescriptor) -> BufferedState[Any]:
    """Return the buffered state of ``descriptor``'s kind."""
    if isinstance(descriptor, ValueStateDescriptor):
        return BufferedValueState(op, descriptor)
    if isinstance(descriptor, ListStateDescriptor):
        return BufferedListState(op, descriptor)
    if isinstance(descriptor, MapStateDescriptor):
        return BufferedMapState(op, descriptor)
    if isinstance(descriptor, ReducingStateDescriptor):
        return BufferedReducingState(op, descriptor)
    raise StateError(
        f"a KeyedAsyncFunction keeps value, list, map or reducing state, not "
        f"{type(descriptor).__name__} {descriptor.name!r}"
    )


if TYPE_CHECKING:  # each buffered state implements its kind's protocol: mypy checks it here
    from aiostream_ckpt.jobspec.state import ListState, MapState, ReducingState, ValueState

    _value: type[ValueState[Any]] = BufferedValueState
    _list: type[ListState[Any]] = BufferedListState
    _map: type[MapState[Any, Any]] = BufferedMapState
    _reducing: type[ReducingState[Any]] = BufferedReducingState
