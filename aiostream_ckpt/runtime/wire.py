"""What a channel between processes puts on the wire: frames, elements, record codecs.

A frame is a 9-byte header (payload length, channel id, kind) and a payload.
Batches of records are encoded by the channel's :class:`BatchCodec`; control
elements (barriers, watermarks, idleness, end-of-input, cancelled checkpoints)
by fixed ``struct`` layouts, so they stay in band and in order with the
records. Credits travel the other way (see :mod:`~aiostream_ckpt.runtime.network.remote`).

Record codecs, as for keyed state (:mod:`aiostream_ckpt.state.codecs`):

* ``json`` (the default): orjson, for JSON-like records. A batch that would
  not come back equal (a tuple becomes a list, NaN becomes null) is refused at
  the sender with the record's misfit named, never changed silently: an app
  must behave the same whether its operators share a process or not. Flat
  records (dicts of str, int, bool, None and finite floats, or such scalars)
  are proven exact by their types, one pass over the batch's values; only
  other batches are decoded again and compared (:func:`exact_by_types`).
  Records straight from a source that declares them exact (``json_exact``:
  the file source's parsed lines, the generator, a KafkaSource with the
  default deserializer) are not checked at all
  (``encode(batch, trusted=True)``; the graph decides, ``runtime.graph``).
* a declared record type: msgspec's JSON codec with ``list[type]``
  (dataclasses, datetimes, tuples, ``msgspec.Struct`` ... come back as such).
* ``pickle``: any picklable record, by opt-in only (decoding runs code).
"""

from __future__ import annotations

import pickle
import struct
from enum import IntEnum
from itertools import chain
from typing import Any, Protocol

import msgspec
import orjson

from aiostream_ckpt.checkpoint.barriers import CancelCheckpoint, CheckpointBarrier, CheckpointKind
from aiostream_ckpt.errors import ChannelError, ChannelRecordError
from aiostream_ckpt.runtime.elements import (
    ACTIVE,
    END_OF_INPUT,
    IDLE,
    EndOfInput,
    Watermark,
    WatermarkStatus,
)
from aiostream_ckpt.state.codecs import EXACT_SCALARS, json_misfit, type_name

#: payload length, channel id, kind
HEADER = struct.Struct("<IIB")
_BARRIER = struct.Struct("<qdBB")  # id, timestamp, kind, flags (1: unaligned, 2: timeoutable)
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_KINDS = list(CheckpointKind)
_DICT_ONLY = frozenset({dict})
_EXACT_OR_FLOAT = EXACT_SCALARS | {float}
_values = dict.values


class FrameKind(IntEnum):
    BATCH = 0
    BARRIER = 1
    WATERMARK = 2
    STATUS = 3
    END = 4
    CANCEL = 5
    #: receiver -> sender: the payload (u32) more elements may be sent on the channel
    CREDIT = 6
    #: the peer closes the connection on purpose: the EOF that follows is no failure
    GOODBYE = 7
    #: a control message between processes (orjson; hello, acks, commits), outside any channel
    MESSAGE = 8


class BatchCodec(Protocol):
    """Turns a batch (a ``list`` of records) into bytes and back, the same."""

    name: str

    def encode(self, batch: list[Any], trusted: bool = False) -> bytes:
        """``trusted``: the records are known exact for this codec (skip any check)."""
        ...

    def decode(self, data: bytes) -> list[Any]: ...


class JsonBatchCodec:
    """orjson; refuses a batch that would not come back equal (see the module docstring)."""

    name = "json"

    def encode(self, batch: list[Any], trusted: bool = False) -> bytes:
        try:
            data = orjson.dumps(batch)
        except TypeError as exc:  # a datetime, a set, an int beyond 64 bits, a non-str key
            raise _refused(batch, str(exc)) from exc
        if trusted:
            return data
        if not exact_by_types(batch, data) and orjson.loads(data) != batch:
            raise _refused(batch, "it would not come back equal")
        return data

    def decode(self, data: bytes) -> list[Any]:
        batch: list[Any] = orjson.loads(data)
        return batch


def exact_by_types(batch: list[Any], data: bytes) -> bool:
    """Whether ``batch`` (encoded by orjson as ``data``) comes back equal, from types alone.

    True only for batches of flat records: every record a ``dict`` whose values
    are str, int, bool, None or float, or every record such a scalar. orjson
    has already refused non-str keys and ints beyond 64 bits; a non-finite
    float becomes ``null``, so a float passes only when ``data`` holds no
    ``null`` at all. False means "not proven" (nested values, tuples, enums,
    UUIDs ...): the caller decodes and compares. One C-level pass over the
    values (~4x cheaper than decoding again and comparing, for pv_count's
    records) instead of a round trip.
    """
    kinds = set(map(type, batch))
    if kinds == _DICT_ONLY:
        kinds = set(map(type, chain.from_iterable(map(_values, batch))))
    if kinds <= EXACT_SCALARS:
        return True
    return kinds <= _EXACT_OR_FLOAT and b"null" not in data


def _refused(batch: list[Any], why: str) -> ChannelRecordError:
    bad = next(((i, m) for i, r in enumerate(batch) if (m := json_misfit(r, "record"))), None)
    where = f"record {bad[0]} of the batch: {bad[1]}" if bad else why
    return ChannelRecordError(
        f"a record cannot cross to another process as JSON ({where}); channels between "
        "processes carry int, str, bool, None, finite float and list/dict (str keys) of "
        "those: declare the record type or set job.channel_serializer=pickle"
    )


class TypedBatchCodec:
    """msgspec JSON with a declared record type (the state codec's rule, per batch)."""

    def __init__(self, record_type: Any) -> None:
        self.name = f"json[{type_name(record_type)}]"
        self._encode = msgspec.json.Encoder().encode
        try:
            self._decode = msgspec.json.Decoder(list[record_type]).decode
        except TypeError as exc:
            raise ChannelError(
                f"record type {type_name(record_type)} is not supported: {exc}", retriable=False
            ) from exc

    def encode(self, batch: list[Any], trusted: bool = False) -> bytes:
        try:
            return self._encode(batch)
        except (msgspec.EncodeError, TypeError, ValueError) as exc:
            raise ChannelRecordError(
                f"a record cannot be encoded as {self.name}: {exc}", retriable=False
            ) from exc

    def decode(self, data: bytes) -> list[Any]:
        try:
            batch: list[Any] = self._decode(data)
        except msgspec.ValidationError as exc:
            raise ChannelRecordError(
                f"a record does not fit the declared type {self.name}: {exc}", retriable=False
            ) from exc
        return batch


class PickleBatchCodec:
    """Any picklable record; opt-in only, since decoding runs code."""

    name = "pickle"

    def encode(self, batch: list[Any], trusted: bool = False) -> bytes:
        try:
            return pickle.dumps(batch, protocol=5)
        except Exception as exc:
            raise ChannelRecordError(f"a record cannot be pickled: {exc}") from exc

    def decode(self, data: bytes) -> list[Any]:
        batch: list[Any] = pickle.loads(data)
        return batch


def batch_codec(serializer: str = "json", record_type: Any = None) -> BatchCodec:
    """Return a channel's codec: ``json`` (typed when ``record_type`` is given) or ``pickle``."""
    if serializer == "pickle":
        return PickleBatchCodec()
    if serializer != "json":
        raise ChannelError(f"unknown channel serializer {serializer!r}", retriable=False)
    return JsonBatchCodec() if record_type is None else TypedBatchCodec(record_type)


def encode_control(element: Any) -> tuple[FrameKind, bytes]:
    """Return the frame kind and payload of a control element."""
    cls = type(element)
    if cls is CheckpointBarrier:
        kind = _KINDS.index(element.kind)
        flags = element.unaligned | element.timeoutable << 1
        payload = _BARRIER.pack(element.checkpoint_id, element.timestamp, kind, flags)
        return FrameKind.BARRIER, payload
    if cls is Watermark:
        return FrameKind.WATERMARK, _I64.pack(element.timestamp)
    if cls is WatermarkStatus:
        return FrameKind.STATUS, b"\x01" if element.idle else b"\x00"
    if cls is EndOfInput:
        return FrameKind.END, b""
    if cls is CancelCheckpoint:
        return FrameKind.CANCEL, _I64.pack(element.checkpoint_id)
    raise ChannelError(f"{cls.__name__} cannot be sent to another process", retriable=False)


def decode_control(kind: int, payload: bytes) -> Any:
    """Return the control element of a frame (``kind`` is not ``BATCH``)."""
    if kind == FrameKind.BARRIER:
        cid, ts, k, flags = _BARRIER.unpack(payload)
        return CheckpointBarrier(cid, ts, _KINDS[k], bool(flags & 1), bool(flags & 2))
    if kind == FrameKind.WATERMARK:
        return Watermark(_I64.unpack(payload)[0])
    if kind == FrameKind.STATUS:
        return IDLE if payload == b"\x01" else ACTIVE
    if kind == FrameKind.END:
        return END_OF_INPUT
    if kind == FrameKind.CANCEL:
        return CancelCheckpoint(_I64.unpack(payload)[0])
    raise ChannelError(f"unknown frame kind {kind}", retriable=False)


def credit_payload(n: int) -> bytes:
    return _U32.pack(n)


def credit_count(payload: bytes) -> int:
    n: int = _U32.unpack(payload)[0]
    return n
