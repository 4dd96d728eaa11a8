"""A lean record path for one ``AIOKafkaConsumer``: the fetched C records, not ``ConsumerRecord``.

aiokafka turns every fetched record into a ``ConsumerRecord`` dataclass (sizes,
headers tuple, deserializers) through a generator wrapped in a Python
``__next__``: about 1 CPU s per million records the source reader throws away,
since it reads only ``offset``, ``key`` and ``value``. :func:`install_lean_fetch`
makes one consumer's fetcher hand out the batch's own ``DefaultRecord``
objects instead. The filtering stays aiokafka's own: the buffered
``PartitionRecords`` keep their ``_unpack_records`` (CRC check, aborted
transactions and control batches skipped under ``read_committed``), only its
last step, ``_consumer_record``, and the ``__next__`` hop are replaced. It is
per consumer (its fetcher's buffer), never a patch of aiokafka's module
globals, so the committer's and validators' consumers in the same process are
untouched. Written against the pinned aiokafka 0.14.0: when its internals are
not the expected ones, or the consumer has deserializers, nothing is changed.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from aiokafka.consumer.fetcher import FetchResult, PartitionRecords

log = logging.getLogger(__name__)


class _LeanPartitionRecords(PartitionRecords):  # type: ignore[misc]
    """aiokafka's ``PartitionRecords`` yielding the batch's records as they are."""

    def __iter__(self) -> Any:
        # ``FetchResult.getall`` iterates us: hand it the generator itself. The
        # stock ``__next__`` only adds a Python call per record; once drained,
        # the FetchResult drops us, so its cycle-breaking is not needed.
        it = self._records_iterator
        return it if it is not None else iter(())

    def _consumer_record(self, tp: Any, record: Any) -> Any:
        return record


class _LeanBuffer(OrderedDict):  # type: ignore[type-arg]
    """The fetcher's buffer of fetched partitions, made lean as they come in."""

    def __setitem__(self, tp: Any, result: Any) -> None:
        if type(result) is FetchResult:
            records = result._partition_records
            if type(records) is PartitionRecords and records._records_iterator is not None:
                records.__class__ = _LeanPartitionRecords
        super().__setitem__(tp, result)


def install_lean_fetch(consumer: Any) -> bool:
    """Make the started ``consumer`` return lean records; whether it did.

    The records then have ``offset``, ``key``, ``value``, ``timestamp`` and
    ``headers`` but not the other ``ConsumerRecord`` fields.
    """
    fetcher: Any = getattr(consumer, "_fetcher", None)
    buffer = getattr(fetcher, "_records", None)
    if (
        type(buffer) is not OrderedDict
        or fetcher._key_deserializer is not None
        or fetcher._value_deserializer is not None
        or not hasattr(PartitionRecords, "_consumer_record")
    ):
        log.debug("aiokafka fetcher not as expected: ConsumerRecord path kept")
        return False
    fetcher._records = _LeanBuffer(buffer)
    return True
