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

import re
import zlib
from dataclasses import dataclass
from typing import Any

import orjson

DEFAULT_MAX_PARALLELISM = 128

_SHARD_DIR = re.compile(r"shard-(\d+)-of-(\d+)")


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


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` of ``count``: the part of a job one daemon runs (``--shard I/N``).

    A shard owns the key groups instance ``index`` of ``count`` would own
    (:meth:`key_groups`), so it lines up with partition ``index`` of a topic of
    ``count`` partitions written by key group. Inside it the job runs at its
    own parallelism ``p``; its subtask ``i`` *is* subtask ``index * p + i`` of
    a job at parallelism ``count * p`` (:meth:`subtask`): key groups, state
    handles, source splits and transactional ids all use that global index,
    so N shards together are exactly one job at ``N * p``, and a rescale from
    N to M shards is the restore at another parallelism that already exists.
    The ranges agree: the subtasks ``index * p .. index * p + p - 1`` of
    ``count * p`` own exactly :meth:`key_groups`.

    ``Shard(0, 1)`` (:data:`WHOLE_JOB`) is a job without ``--shard``: every
    global index is the local one.

    >>> Shard(1, 2).key_groups(128)
    KeyGroupRange(start=64, end=127)
    >>> Shard(1, 2).subtask(0, 2), Shard(1, 2).parallelism(2)
    (2, 4)
    >>> KeyGroupRange.for_operator(2, 4, 128).start == Shard(1, 2).key_groups(128).start
    True
    >>> Shard.parse("1/2")
    Shard(index=1, count=2)
    >>> str(Shard(1, 2)), Shard(1, 2).dirname
    ('1/2', 'shard-1-of-2')
    """

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """Parse ``I/N``; raises ValueError saying what is expected."""
        index, sep, count = str(text).strip().partition("/")
        try:
            if not sep:
                raise ValueError
            shard = cls(int(index), int(count))
        except ValueError:
            raise ValueError(f"I/N: shard I of N shards, e.g. 0/2, not {text!r}") from None
        if shard.count < 1 or not 0 <= shard.index < shard.count:
            raise ValueError(
                f"I/N with I in 0..N-1 (shard {shard.index} of {shard.count} does not exist)"
            )
        return shard

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def sharded(self) -> bool:
        """Whether other shards run the rest of the job (False without ``--shard``)."""
        return self.count > 1

    @property
    def dirname(self) -> str:
        """The shard's directory under the job's checkpoint and output directories."""
        return f"shard-{self.index}-of-{self.count}"

    @classmethod
    def from_dirname(cls, name: str) -> Shard | None:
        """Return the shard whose directory is ``name`` (``shard-I-of-N``); None for others.

        >>> Shard.from_dirname("shard-1-of-2"), Shard.from_dirname("chk-3")
        (Shard(index=1, count=2), None)
        """
        m = _SHARD_DIR.fullmatch(name)
        if m is None:
            return None
        index, count = int(m.group(1)), int(m.group(2))
        return cls(index, count) if 0 <= index < count else None

    def key_groups(self, max_parallelism: int) -> KeyGroupRange:
        return KeyGroupRange.for_operator(self.index, self.count, max_parallelism)

    def subtask(self, local: int, parallelism: int) -> int:
        """Global index of local subtask ``local`` of an operator at ``parallelism`` here."""
        return self.index * parallelism + local

    def parallelism(self, parallelism: int) -> int:
        """Global parallelism of an operator that runs ``parallelism`` subtasks in each shard."""
        return self.count * parallelism

    def of_key_group(self, key_group: int, max_parallelism: int) -> int:
        """Return the shard (of ``count``) that owns ``key_group``."""
        return operator_index_for_key_group(key_group, self.count, max_parallelism)


#: A job run without ``--shard``: one shard holding every key group.
WHOLE_JOB = Shard(0, 1)
