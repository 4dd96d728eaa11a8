"""State descriptors: what a process function asks the backend for.

A descriptor names the state (unique within its operator), may declare the
type of its values, and says how they are serialized (see
:mod:`~aiostream_ckpt.state.codecs`). Untyped, a state keeps only values JSON
gives back exactly; with a declared type (``ValueStateDescriptor("last_seen",
datetime)``, ``MapStateDescriptor("m", str, tuple[int, float])``) it keeps
that type, dataclasses, enums, sets, tuples included, and reads it back as
such after a restore. ``int | None`` (or ``Optional[int]``) declares a state
that keeps ``None`` too. ``serializer="pickle"`` is an explicit opt-in, because
unpickling checkpoint bytes runs code.

For mypy a declared type is a ``TypeForm`` (PEP 747), so a union or a generic
alias types the state as exactly that (``ListStateDescriptor("xs", int | None)``
is a ``ListStateDescriptor[int | None]``); ``None`` or nothing is ``Any``.

>>> from datetime import datetime
>>> ValueStateDescriptor("last_seen", datetime).value_type is datetime
True
>>> MapStateDescriptor("by_day", str, int).key_type
<class 'str'>
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, overload

from typing_extensions import TypeForm, TypeVar

from aiostream_ckpt.durations import parse_duration

# An untyped descriptor (``ListStateDescriptor("xs")``) is a state of ``Any``, not of nothing.
T = TypeVar("T", default=Any)
K = TypeVar("K", default=Any)
V = TypeVar("V", default=Any)

Serializer = Literal["json", "pickle"]


class TtlUpdateType(Enum):
    """When a TTL'd entry's clock restarts (Flink's ``StateTtlConfig.UpdateType``)."""

    ON_CREATE_AND_WRITE = "on_create_and_write"
    ON_READ_AND_WRITE = "on_read_and_write"


@dataclass(frozen=True, slots=True)
class StateTtlConfig:
    """Expire entries ``ttl`` seconds (or ``"10m"``, as in the config) after their last update.

    Expired entries are never returned; they are dropped lazily on access and
    when the backend flushes, so checkpoints shrink over time.
    """

    ttl: float
    update_type: TtlUpdateType = TtlUpdateType.ON_CREATE_AND_WRITE

    def __post_init__(self) -> None:
        object.__setattr__(self, "ttl", parse_duration(self.ttl))
        if self.ttl <= 0:
            raise ValueError(f"state TTL must be positive, got {self.ttl}")


@dataclass(frozen=True, slots=True)
class StateDescriptor:
    """Base of all descriptors: a name, then (keyword-only) a serializer and an optional TTL."""

    name: str
    _: KW_ONLY
    serializer: Serializer = "json"
    ttl: StateTtlConfig | None = None

    def __post_init__(self) -> None:
        if not self.name or "\x00" in self.name or len(self.name.encode()) > 200:
            raise ValueError(f"invalid state name {self.name!r}")
        if self.serializer not in ("json", "pickle"):
            raise ValueError(f"unknown serializer {self.serializer!r}; use 'json' or 'pickle'")

    kind: ClassVar[str] = ""

    def value_types(self) -> tuple[Any, Any]:
        """Return ``(stored type, type of one value)``: None when undeclared (list: the list)."""
        return None, None

    def map_key_type(self) -> Any:
        return None


@dataclass(frozen=True, slots=True)
class ValueStateDescriptor(StateDescriptor, Generic[T]):
    """One value per key of ``value_type``; ``default`` is returned for a key never written.

    For mypy the descriptor's type is the type ``value()`` returns: ``T`` with
    a default, ``T | None`` without one (a key never written reads ``None``).
    """

    value_type: Any = None
    _: KW_ONLY
    default: Any = None

    kind: ClassVar[str] = "value"

    if TYPE_CHECKING:

        @overload
        def __init__(
            self: ValueStateDescriptor[Any],
            name: str,
            value_type: None = None,
            *,
            default: None = None,
            serializer: Serializer = ...,
            ttl: StateTtlConfig | None = ...,
        ) -> None: ...
        @overload
        def __init__(
            self: ValueStateDescriptor[T],
            name: str,
            value_type: None = None,
            *,
            default: T,
            serializer: Serializer = ...,
            ttl: StateTtlConfig | None = ...,
        ) -> None: ...
        @overload
        def __init__(
            self: ValueStateDescriptor[T],
            name: str,
            value_type: TypeForm[T],
            *,
            default: T,
            serializer: Serializer = ...,
            ttl: StateTtlConfig | None = ...,
        ) -> None: ...
        @overload
        def __init__(
            self: ValueStateDescriptor[T | None],
            name: str,
            value_type: TypeForm[T],
            *,
            serializer: Serializer = ...,
            ttl: StateTtlConfig | None = ...,
        ) -> None: ...
        def __init__(self, name: str, *args: Any, **kw: Any) -> None: ...

    def value_types(self) -> tuple[Any, Any]:
        return self.value_type, None


@dataclass(frozen=True, slots=True)
class ListStateDescriptor(StateDescriptor, Generic[T]):
    """A list of values of ``element_type`` per key."""

    element_type: Any = None

    kind: ClassVar[str] = "list"

    if TYPE_CHECKING:

        @overload
        def __init__(
            self: ListStateDescriptor[Any],
            name: str,
            element_type: None = None,
            *,
            serializer: Serializer = ...,
            ttl: StateTtlConfig | None = ...,
        ) -> None: ...
        @overload
        def __init__(
            self: ListStateDescriptor[T],
            name: str,
            element_type: TypeForm[T],
            *,
            serializer: Serializer = ...,
            ttl: StateTtlConfig | None = ...,
        ) -> None: ...
        def __init__(self, name: str, *args: Any, **kw: Any) -> None: ...

    def value_types(self) -> tuple[Any, Any]:
        t = self.element_type
        return (None, None) if t is None else (list[t], t)  # type: ignore[valid-type]


@dataclass(frozen=True, slots=True)
class MapStateDescriptor(StateDescriptor, Generic[K, V]):
    """A map per key, ``key_type -> value_type``; map keys are stored like stream keys."""

    key_type: Any = None
    value_type: Any = None

    kind: ClassVar[str] = "map"

    if TYPE_CHECKING:

        @overload
        def __init__(
            self: MapStateDescriptor[Any, Any],
            name: str,
            key_type: None,
            value_type: None = None,
            *,
            serializer: Serializer = ...,
            ttl: StateTtlConfig | None = ...,
        ) -> None: ...
        @overload
        def __init__(
            self: MapStateDescriptor[Any, V],
            name: str,
            key_type: None,
            value_type: TypeForm[V],
            *,
            serializer: Serializer = ...,
            ttl: StateTtlConfig | None = ...,
        ) -> None: ...
        @overload
        def __init__(
            self: MapStateDescriptor[K, Any],
            name: str,
            key_type: TypeForm[K] = ...,
            value_type: None = None,
            *,
            serializer: Serializer = ...,
            ttl: StateTtlConfig | None = ...,
        ) -> None: ...
        @overload
        def __init__(
            self: MapStateDescriptor[K, V],
            name: str,
            key_type: TypeForm[K] = ...,
            value_type: TypeForm[V] = ...,
            *,
            serializer: Serializer = ...,
            ttl: StateTtlConfig | None = ...,
        ) -> None: ...
        def __init__(self, name: str, *args: Any, **kw: Any) -> None: ...

    def value_types(self) -> tuple[Any, Any]:
        return self.value_type, None

    def map_key_type(self) -> Any:
        return self.key_type


@dataclass(frozen=True, slots=True)
class ReducingStateDescriptor(StateDescriptor, Generic[T]):
    """One value of ``value_type`` per key, folded with ``reduce_fn`` on every ``add``."""

    value_type: Any = None
    _: KW_ONLY
    reduce_fn: Callable[[Any, Any], Any] = field(default=lambda a, b: b)

    kind: ClassVar[str] = "reducing"

    if TYPE_CHECKING:

        @overload
        def __init__(
            self: ReducingStateDescriptor[T],
            name: str,
            value_type: None = None,
            *,
            reduce_fn: Callable[[T, T], T] = ...,
            serializer: Serializer = ...,
            ttl: StateTtlConfig | None = ...,
        ) -> None: ...
        @overload
        def __init__(
            self: ReducingStateDescriptor[T],
            name: str,
            value_type: TypeForm[T],
            *,
            reduce_fn: Callable[[T, T], T] = ...,
            serializer: Serializer = ...,
            ttl: StateTtlConfig | None = ...,
        ) -> None: ...
        def __init__(self, name: str, *args: Any, **kw: Any) -> None: ...

    def value_types(self) -> tuple[Any, Any]:
        return self.value_type, None
