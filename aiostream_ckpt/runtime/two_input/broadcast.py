"""Broadcast state and the operators of ``connect(stream.broadcast(descriptor)).process``.

Broadcast state lives in memory (Flink's heap broadcast state): it is small
(rules, thresholds), and every instance holds all of it. Values are checked at
``put`` with the state codecs (:mod:`aiostream_ckpt.state.codecs`), so a value
that would not read back the same fails at the line that stored it, not at the
next checkpoint. Instance 0 writes the maps into its operator state at the
barrier; every instance restores them from there, at any parallelism (see
:mod:`aiostream_ckpt.jobspec.broadcast` for why that copy is everyone's).

The operators are the two-input ones of :mod:`aiostream_ckpt.runtime.two_input.co_process`
with the broadcast input as the second: its batches reach ``process_batch2``.
"""

from __future__ import annotations

import base64
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.errors import StateError, StateMigrationError
from aiostream_ckpt.jobspec.broadcast import BroadcastSpec
from aiostream_ckpt.jobspec.functions import Context, OnTimerContext, RuntimeContext, TimeDomain
from aiostream_ckpt.runtime.operators import RecordFailed
from aiostream_ckpt.runtime.two_input.co_process import CoProcessOperator, KeyedCoProcessOperator
from aiostream_ckpt.state.codecs import MapKeyCodec, value_codec
from aiostream_ckpt.state.descriptors import MapStateDescriptor, StateDescriptor
from aiostream_ckpt.state.evolution import (
    check_class_change,
    check_type_change,
    declared_classes,
    declared_types,
)
from aiostream_ckpt.state.serde import decode_key

BROADCAST_KEY = "broadcast"
#: each broadcast map's serializer and declared types, beside the maps (see ``restore``)
TYPES_KEY = "broadcast_types"


class BroadcastStateError(StateError):
    """Broadcast state misused: written from the non-broadcast side, or not declared."""


class BroadcastState:
    """One broadcast map (Flink's ``BroadcastState``): ``get``/``put``/``remove``/``items``."""

    def __init__(self, descriptor: MapStateDescriptor[Any, Any]) -> None:
        self.descriptor = descriptor
        self.name = descriptor.name
        self._codec = value_codec(
            descriptor.serializer, descriptor.value_type, state=descriptor.name
        )
        self._keys = MapKeyCodec(descriptor.key_type, decode_key)
        self._map: dict[Any, Any] = {}

    def get(self, key: Any, default: Any = None) -> Any:
        return self._map.get(key, default)

    def contains(self, key: Any) -> bool:
        return key in self._map

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(list(self._map.items()))

    def keys(self) -> Iterator[Any]:
        return iter(list(self._map))

    def values(self) -> Iterator[Any]:
        return iter(list(self._map.values()))

    def is_empty(self) -> bool:
        return not self._map

    def __len__(self) -> int:
        return len(self._map)

    def put(self, key: Any, value: Any) -> None:
        self._keys.check(key, self._keys.dumps(key, self.name), self.name)
        self._codec.check(value, self.name)
        self._map[key] = value

    def remove(self, key: Any) -> None:
        self._map.pop(key, None)

    def clear(self) -> None:
        self._map.clear()

    def snapshot(self) -> list[list[str]]:
        """Each entry as ``[key JSON, value]`` (the value's codec bytes, base64 when pickled)."""
        dumps = self._codec.dumps
        pickled = self.descriptor.serializer == "pickle"
        out = []
        for k, v in self._map.items():
            raw = dumps(v)
            text = base64.b64encode(raw).decode("ascii") if pickled else raw.decode()
            out.append([orjson.dumps(k).decode(), text])
        return out

    def restore(self, entries: list[list[str]]) -> None:
        loads = self._codec.loads
        pickled = self.descriptor.serializer == "pickle"
        self._map = {
            self._keys.loads(k.encode()): loads(base64.b64decode(v) if pickled else v.encode())
            for k, v in entries
        }


class ReadOnlyBroadcastState:
    """What the non-broadcast side sees: reads go through, writes are refused."""

    __slots__ = ("_state", "contains", "get", "is_empty", "items", "keys", "values")

    def __init__(self, state: BroadcastState) -> None:
        self._state = state
        self.get = state.get
        self.contains = state.contains
        self.items = state.items
        self.keys = state.keys
        self.values = state.values
        self.is_empty = state.is_empty

    def __len__(self) -> int:
        return len(self._state)

    def _refuse(self, *args: Any) -> None:
        raise BroadcastStateError(
            f"broadcast state {self._state.name!r} is read-only here: only "
            "process_broadcast_element may change it (every instance must hold the same "
            "broadcast state)"
        )

    put = remove = clear = _refuse


class BroadcastStates:
    """The broadcast maps of one operator instance, by descriptor name."""

    def __init__(self, uid: str, descriptors: tuple[MapStateDescriptor[Any, Any], ...]) -> None:
        self.uid = uid
        self.states = {d.name: BroadcastState(d) for d in descriptors}
        self.read_only = _ReadOnlyStates(self)

    def get(self, descriptor: MapStateDescriptor[Any, Any]) -> BroadcastState:
        state = self.states.get(descriptor.name)
        if state is None:
            raise BroadcastStateError(
                f"operator {self.uid!r}: no broadcast state {descriptor.name!r}; declared: "
                f"{sorted(self.states)} (pass the descriptor to stream.broadcast(...))"
            )
        if state.descriptor != descriptor:
            raise BroadcastStateError(
                f"operator {self.uid!r}: broadcast state {descriptor.name!r} was declared as "
                f"{state.descriptor!r}, asked for as {descriptor!r}"
            )
        return state

    def snapshot(self) -> dict[str, Any]:
        """Return the maps, each with its serializer and declared types (instance 0's)."""
        return {
            BROADCAST_KEY: {name: s.snapshot() for name, s in self.states.items()},
            TYPES_KEY: {name: _describe(s.descriptor) for name, s in self.states.items()},
        }

    def restore(self, restored: CompletedCheckpoint) -> None:
        """Take the maps instance 0 wrote into ``restored`` (none there: start empty).

        A map whose serializer or declared types changed since is refused, as
        keyed state is (``LmdbStateBackend.create_state``): its entries would
        read back as another type, or not at all.
        """
        for _, st in sorted(restored.subtask_states(self.uid).items()):
            operator = st.get("operator") or {}
            maps = operator.get(BROADCAST_KEY)
            if maps is None:
                continue
            for name, old in (operator.get(TYPES_KEY) or {}).items():
                if name in self.states:
                    self._check_unchanged(name, old)
            unknown = sorted(set(maps) - set(self.states))
            if unknown:
                raise BroadcastStateError(
                    f"operator {self.uid!r}: the checkpoint holds broadcast state {unknown} "
                    f"that the app no longer declares (declared: {sorted(self.states)})"
                )
            for name, entries in maps.items():
                self.states[name].restore(entries)
            return

    def _check_unchanged(self, name: str, old: dict[str, Any]) -> None:
        new = _describe(self.states[name].descriptor)
        if old["serializer"] != new["serializer"]:
            raise StateMigrationError(
                f"operator {self.uid!r}: broadcast state {name!r} was checkpointed with "
                f"serializer {old['serializer']!r}, the app now declares {new['serializer']!r}"
            )
        if new["serializer"] == "json":
            check_type_change(name, "map", old["types"], new["types"])
            check_class_change(name, old.get("classes"), self.states[name].descriptor)


def _describe(descriptor: MapStateDescriptor[Any, Any]) -> dict[str, Any]:
    """Return a map's serializer and types; each checkpoint rewrites all entries under them."""
    described: dict[str, Any] = {
        "serializer": descriptor.serializer,
        "types": declared_types(descriptor),
    }
    if classes := declared_classes(descriptor):
        described["classes"] = classes
    return described


class _ReadOnlyStates:
    def __init__(self, states: BroadcastStates) -> None:
        self._states = states
        self._views: dict[str, ReadOnlyBroadcastState] = {}

    def get(self, descriptor: MapStateDescriptor[Any, Any]) -> ReadOnlyBroadcastState:
        state = self._states.get(descriptor)
        view = self._views.get(state.name)
        if view is None:
            view = self._views[state.name] = ReadOnlyBroadcastState(state)
        return view


class KeyedBroadcastContext(Context):
    """The broadcast side's context of a keyed function: no key, but every key's state."""

    __slots__ = ("_backend",)

    def __init__(
        self, side: list[tuple[Any, Any]] | None, states: BroadcastStates, backend: Any
    ) -> None:
        super().__init__(None, side, states)
        self._backend = backend

    def apply_to_keyed_state(
        self, descriptor: StateDescriptor, function: Callable[[Any, Any], None]
    ) -> None:
        """Call ``function(key, state)`` for every key of this instance with a value in it.

        Flink's ``applyToKeyedState``: e.g. a withdrawn rule clears what every
        key kept for it. Each instance visits its own keys, so together they
        visit every key once.
        """
        backend = self._backend
        state = backend.create_state(descriptor)
        kc = backend.key_context
        for key in list(backend.keys(descriptor.name)):
            kc.key = self.current_key = key
            function(key, state)
        kc.key = self.current_key = None


class _BroadcastSide(ABC):
    """What both broadcast operators add to their two-input base: the maps and their snapshot."""

    broadcast_states: BroadcastStates
    _broadcast_ctx: Context
    _ctx: Context
    _subtask = 0

    def process_batch2(self, batch: list[Any]) -> list[Any]:
        """Broadcast records: the function gets the writable maps (and no key)."""
        ctx, self._ctx = self._ctx, self._broadcast_ctx
        try:
            return self._broadcast_batch(batch)
        except RecordFailed as failure:
            # dead-lettered, the rest of the batch goes on here; once: every instance has it
            failure.resume = self.process_batch2
            failure.broadcast = True
            raise
        finally:
            self._ctx = ctx

    @abstractmethod
    def _broadcast_batch(self, batch: list[Any]) -> list[Any]:
        """Run the function's ``process_broadcast_element`` on each record of ``batch``."""

    def snapshot_state(self) -> dict[str, Any] | None:
        if self._subtask != 0:
            return None  # one copy is enough: every instance holds the same maps
        return self.broadcast_states.snapshot()

    def restore_state(self, restored: CompletedCheckpoint, subtask: int, parallelism: int) -> None:
        self.broadcast_states.restore(restored)


class BroadcastProcessOperator(_BroadcastSide, CoProcessOperator):
    """Runs a :class:`~aiostream_ckpt.jobspec.broadcast.BroadcastProcessFunction`."""

    def __init__(self, uid: str, spec: BroadcastSpec) -> None:
        super().__init__(uid, spec.function)  # type: ignore[arg-type]
        self.broadcast_states = BroadcastStates(uid, spec.descriptors)

    def open(self, ctx: RuntimeContext) -> None:
        self._subtask = ctx.subtask_index
        super().open(ctx)
        side = self.side_output
        self._ctx = Context(side_output=side, broadcast=self.broadcast_states.read_only)
        self._broadcast_ctx = Context(side_output=side, broadcast=self.broadcast_states)

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return self._run(batch, self.function.process_element)

    def _broadcast_batch(self, batch: list[Any]) -> list[Any]:
        return self._run(batch, self.function.process_broadcast_element)  # type: ignore[attr-defined]


class KeyedBroadcastProcessOperator(_BroadcastSide, KeyedCoProcessOperator):
    """Runs a :class:`~aiostream_ckpt.jobspec.broadcast.KeyedBroadcastProcessFunction`."""

    def __init__(self, uid: str, spec: BroadcastSpec) -> None:
        ks = spec.key_selectors[0]
        assert ks is not None
        super().__init__(uid, spec.function, (ks, _no_key))  # type: ignore[arg-type]
        self.broadcast_states = BroadcastStates(uid, spec.descriptors)

    def open(self, ctx: RuntimeContext) -> None:
        self._subtask = ctx.subtask_index
        super().open(ctx)
        timers, side, ro = self._timers, self.side_output, self.broadcast_states.read_only
        self._ctx = Context(timers, side, ro)
        self._event_ctx = OnTimerContext(timers, TimeDomain.EVENT_TIME, side, ro)
        self._proc_ctx = OnTimerContext(timers, TimeDomain.PROCESSING_TIME, side, ro)
        # no timers: the broadcast side runs outside of any key
        self._broadcast_ctx = KeyedBroadcastContext(side, self.broadcast_states, self.backend)

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return self._run_keyed(batch, self.function.process_element, self._key_selectors[0])

    def _broadcast_batch(self, batch: list[Any]) -> list[Any]:
        pe = self.function.process_broadcast_element  # type: ignore[attr-defined]
        return self._run_keyed(batch, pe, _no_key)


def _no_key(record: Any) -> None:
    return None
