"""Key groups: the unit in which keyed state is partitioned and redistributed.

As in Flink, ``key_group = hash(key) % max_parallelism`` and operator instance
``i`` of ``p`` owns a contiguous range of key groups. A savepoint taken at one
parallelism can therefore be restored at another by handing out ranges again.
The hash must be stable across processes, so it is CRC-32 of the key's
canonical bytes, never Python's salted ``hash()``.
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

    def intersects(self, other: KeyGroupRange) -> bool:
        return self.start <= other.end and other.start <= self.end

    def to_json(self) -> list[int]:
        return [self.start, self.end]

    @classmethod
    def from_json(cls, data: list[int]) -> KeyGroupRange:
        return cls(int(data[0]), int(data[1]))
