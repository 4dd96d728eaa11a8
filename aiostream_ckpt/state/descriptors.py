"""State descriptors: what a process function asks the backend for.

A descriptor names the state (unique within its operator) and says how values
are serialized. The default serializer is orjson; ``serializer="pickle"`` is an
explicit opt-in by the app, because unpickling checkpoint bytes runs code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Generic, Literal, TypeVar

from aiostream_ckpt.durations import parse_duration

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

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
    """Base of all descriptors: a name, a serializer, an optional TTL."""

    name: str
    serializer: Serializer = "json"
    ttl: StateTtlConfig | None = None

    def __post_init__(self) -> None:
        if not self.name or "\x00" in self.name or len(self.name.encode()) > 200:
            raise ValueError(f"invalid state name {self.name!r}")
        if self.serializer not in ("json", "pickle"):
            raise ValueError(f"unknown serializer {self.serializer!r}; use 'json' or 'pickle'")

    kind: ClassVar[str] = ""


@dataclass(frozen=True, slots=True)
class ValueStateDescriptor(StateDescriptor, Generic[T]):
    """One value per key; ``default`` is returned for a key never written."""

    default: Any = None

    kind: ClassVar[str] = "value"


@dataclass(frozen=True, slots=True)
class ListStateDescriptor(StateDescriptor, Generic[T]):
    """A list of values per key."""

    kind: ClassVar[str] = "list"


@dataclass(frozen=True, slots=True)
class MapStateDescriptor(StateDescriptor, Generic[K, V]):
    """A map per key; map keys must be serializable like stream keys."""

    kind: ClassVar[str] = "map"


@dataclass(frozen=True, slots=True)
class ReducingStateDescriptor(StateDescriptor, Generic[T]):
    """One value per key, folded with ``reduce_fn`` on every ``add``."""

    reduce_fn: Callable[[Any, Any], Any] = field(default=lambda a, b: b)

    kind: ClassVar[str] = "reducing"
