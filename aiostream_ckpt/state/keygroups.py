"""Key groups, as the state backends see them: see :mod:`aiostream_ckpt.keygroups`.

The arithmetic lives below every package that needs it (state, the
runtime's partitioners, and connectors whose splits are partitioned by key
group); this name stays for the state backends and their tests.
"""

from __future__ import annotations

from aiostream_ckpt.keygroups import (
    DEFAULT_MAX_PARALLELISM,
    KeyGroupRange,
    key_group_for,
    operator_index_for_key_group,
    serialize_key,
)

__all__ = [
    "DEFAULT_MAX_PARALLELISM",
    "KeyGroupRange",
    "key_group_for",
    "operator_index_for_key_group",
    "serialize_key",
]
