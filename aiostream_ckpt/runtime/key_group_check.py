"""The arrival check of a keyed operator fed without a shuffle (``reinterpret_as_keyed``).

A ``FORWARD_KEYED`` edge trusts the input to be partitioned by key group
already. Keyed state is stored by key group, and a restore (at any
parallelism) hands each instance the state of its key-group range; a record
at an instance that does not own its key's group would start a second count
of that key there, which the next rescale or restore would silently drop.
Flink leaves that undefined; here each instance checks every record's key
before the operator sees it and fails the job, naming the key, its group, the
owner and the split, with nothing of the record in state.

The check costs one key selector call and one dict lookup per record: a key
found in its range is remembered, so its group is computed once per
distinct key (as :class:`~aiostream_ckpt.runtime.partitioners.KeyGroupGate`
caches its routes), and a batch of known keys goes through in one loop
without being copied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiostream_ckpt.errors import PartitioningError
from aiostream_ckpt.keygroups import (
    WHOLE_JOB,
    KeyGroupRange,
    Shard,
    key_group_of,
    operator_index_for_key_group,
)
from aiostream_ckpt.runtime.operators import StreamOperator
from aiostream_ckpt.runtime.partitioners import outside_shard
from aiostream_ckpt.runtime.record_errors import dead_letter_or_raise
from aiostream_ckpt.user_errors import short_repr

_KNOWN_LIMIT = 1 << 20


class KeyGroupCheck(StreamOperator):
    """Pass records whose key group this instance owns; refuse the first that it does not.

    ``describe_input()`` says where the batch came from (the split a source
    read it from), for the error. A key selector that raises is handled as in
    the shuffle: dead-lettered under ``errors.on_process_error=dead_letter``
    in the name of ``target_uid``, or the job fails naming it.

    In a sharded job the same check guards a ``key_by`` chained without a
    shuffle (an operator at parallelism 1 in each shard): a key of another
    shard fails the job naming that shard (:func:`outside_shard`).
    """

    def __init__(
        self,
        target_uid: str,
        key_selector: Callable[[Any], Any],
        *,
        subtask: int,
        parallelism: int,
        max_parallelism: int,
        describe_input: Callable[[], str],
        shard: Shard = WHOLE_JOB,
    ) -> None:
        super().__init__(f"{target_uid}.key-groups")
        self.target_uid = target_uid
        self._key_selector = key_selector
        self._subtask = subtask
        self._parallelism = parallelism
        self._max_parallelism = max_parallelism
        self._range = KeyGroupRange.for_operator(subtask, parallelism, max_parallelism)
        self._describe_input = describe_input
        self._shard = shard
        self._known: dict[Any, None] = {}

    def process_batch(self, batch: list[Any]) -> list[Any]:
        known = self._known
        ks = self._key_selector
        try:
            for rec in batch:
                if ks(rec) not in known:
                    break
            else:
                return batch
        except Exception:
            pass  # a selector that raised: _check_each says on which record
        return self._check_each(batch)

    def _check_each(self, batch: list[Any]) -> list[Any]:
        """Check record by record: the batch has a new key (or a selector that raised)."""
        known = self._known
        ks = self._key_selector
        out: list[Any] = []
        for rec in batch:
            try:
                key = ks(rec)
                if key not in known:
                    self._admit(key, rec)
            except PartitioningError:
                raise
            except Exception as exc:
                name = getattr(ks, "__qualname__", None) or repr(ks)
                dead_letter_or_raise(
                    self.process_errors,
                    f"key selector {name}",
                    self.target_uid,
                    "record",
                    rec,
                    exc,
                    ks,
                )
                continue
            out.append(rec)
        return out

    def _admit(self, key: Any, record: Any) -> None:
        kg = key_group_of(key, self._max_parallelism)
        if kg not in self._range:
            raise PartitioningError(self._misrouted(key, kg, record))
        if len(self._known) >= _KNOWN_LIMIT:
            self._known.clear()
        self._known[key] = None

    def _misrouted(self, key: Any, kg: int, record: Any) -> str:
        p, maxp = self._parallelism, self._max_parallelism
        if kg not in self._shard.key_groups(maxp):
            why = outside_shard(self.target_uid, key, kg, self._shard, maxp)
            return f"{why} (from {self._describe_input()})"
        owner = operator_index_for_key_group(kg, p, maxp)
        own = self._range
        return (
            f"operator {self.target_uid!r} (reinterpret_as_keyed): key {key!r} of record "
            f"{short_repr(record)} is in key group {kg}, which subtask {owner} of {p} owns, but "
            f"it reached subtask {self._subtask} (key groups {own.start}-{own.end} of "
            f"{maxp}) from {self._describe_input()}: that input is not partitioned by this "
            "key as declared (its writer must place records by key group with the same key, "
            "job.max_parallelism and key serialization); the record did not reach state. "
            "Use key_by(...) instead, or repartition the input"
        )
