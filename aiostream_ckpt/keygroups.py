"""Key groups: the unit in which keyed state is partitioned and redistributed.

As in Flink, ``key_group = hash(key) % max_parallelism`` and operator instance
``i`` of ``p`` owns a contiguous range of key groups. A savepoint taken at one
parallelism can therefore be restored at another by handing out ranges again.
The hash must be stable across processes, so it is CRC-32 of the key's
canonical bytes, never Python's salted ``hash()``.

It sits below every package (state, the runtime's partitioners, connectors
whose splits are partitioned by key group): all of them must agree on it
to the bit, or a record reaches an instance that does not own its state.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import orjson

DEFAULT_MAX_PARALLELISM = 128


def serialize_key(key: Any) -> bytes:
    """Canonical bytes of a key (str, int, float, bool, None, or tuples/lists of them).

    >>> serialize_key("app-1")
    b'"app-1"'
    >>> serialize_key(("a", 1))
    b'["a",1]'
    """
    return orjson.dumps(key)


def key_group_for(key_bytes: bytes, max_parallelism: int) -> int:
    """Key group of a serialized key.

    >>> key_group_for(serialize_key("app-1"), 128) == key_group_for(b'"app-1"', 128)
    True
    """
    return zlib.crc32(key_bytes) % max_parallelism


def key_group_of(key: Any, max_parallelism: int) -> int:
    """Key group of a stream key (what ``key_by`` returns).

    >>> key_group_of("app-1", 128) == key_group_for(serialize_key("app-1"), 128)
    True
    """
    return zlib.crc32(orjson.dumps(key)) % max_parallelism


def operator_index_for_key_group(key_group: int, parallelism: int, max_parallelism: int) -> int:
    """Which of ``parallelism`` instances owns ``key_group`` (Flink's formula)."""
    return key_group * parallelism // max_parallelism


@dataclass(frozen=True, slots=True)
class KeyGroupRange:
    """An inclusive range ``[start, end]`` of key groups.

    >>> KeyGroupRange.for_operator(0, 2, 128)
    KeyGroupRange(start=0, end=63)
    >>> KeyGroupRange.for_operator(1, 2, 128)
    KeyGroupRange(start=64, end=127)
    >>> 70 in KeyGroupRange(64, 127)
    True
    """

    start: int
    end: int

    @classmethod
    def for_operator(cls, index: int, parallelism: int, max_parallelism: int) -> KeyGroupRange:
        start = (index * max_parallelism + parallelism - 1) // parallelism
        end = ((index + 1) * max_parallelism - 1) // parallelism
        return cls(start, end)

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def owner(self, parallelism: int, max_parallelism: int) -> int | None:
        """Return the instance of ``parallelism`` whose range holds all of this one, or None.

        What a split partitioned by key group needs to be read without a
        shuffle: its records may only reach the instance owning their state.

        >>> KeyGroupRange(32, 63).owner(2, 128)
        0
        >>> KeyGroupRange(32, 63).owner(4, 128)
        1
        >>> KeyGroupRange(0, 63).owner(4, 128) is None
        True
        """
        first = operator_index_for_key_group(self.start, parallelism, max_parallelism)
        last = operator_index_for_key_group(self.end, parallelism, max_parallelism)
        return first if first == last else None

    def intersects(self, other: KeyGroupRange) -> bool:
        return self.start <= other.end and other.start <= self.end

    def to_json(self) -> list[int]:
        return [self.start, self.end]

    @classmethod
    def from_json(cls, data: list[int]) -> KeyGroupRange:
        return cls(int(data[0]), int(data[1]))
